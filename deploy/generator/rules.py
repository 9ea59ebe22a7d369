"""gpuscale's Prometheus recording and alert rules, as data.

Written here rather than by hand in YAML so that the Xid classes come from policies/health.yaml (one table for the
controller and the pager), and so the plain rule files and the PrometheusRule objects can never disagree.

Label conventions (what dcgm-exporter 4.x and kube-state-metrics put on their series):
- a GPU is ``Hostname, gpu, UUID`` (+ ``modelName``); ``Hostname`` is the node name in Kubernetes mode;
- its workload is ``namespace, pod`` (absent when no pod holds the GPU);
- ``cluster`` is carried through every aggregation when the Prometheus adds it (external or target label), so
  one rule set serves a single cluster and a Thanos/Mimir view of many;
- a training job is ``namespace, training_job``: see ``JOB_MEMBERSHIP``.

Every ``for:`` is at least three scrape intervals (1 m scrapes: a lost scrape never resolves or delays an alert).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# GPU_I_ID/GPU_I_PROFILE keep MIG instances apart (absent on whole GPUs); container stays for the adapter.
GPU = "cluster, Hostname, gpu, UUID, GPU_I_ID, GPU_I_PROFILE, modelName"
GPU_POD = f"{GPU}, namespace, pod, container"
JOB = "cluster, namespace, training_job"

# The thresholds the alerts and their tests share. Ratios are 0..1 as DCGM reports them.
HUNG_SM_ACTIVE = 0.05  # every GPU of the job below this …
HUNG_INTERCONNECT_BYTES = 10e6  # … and the job's NVLink + PCIe traffic below 10 MB/s in total …
BUSY_SM_ACTIVE = 0.3  # … after its busiest GPU had been above this in the hour before
STRAGGLER_RATIO = 0.6  # a rank below 60 % of its job's median rank
IDLE_SM_ACTIVE = 0.01
UTIL_TRAP_UTIL = 80  # GPU_UTIL percent
UTIL_TRAP_SM = 0.3
UTIL_TRAP_TENSOR = 0.1
QUEUE_TIME_SLO_SECONDS = 0.5  # mean time a request waits in the server's queue
WAITING_REQUESTS_SLO = 20  # requests waiting per model
TTFT_P99_SLO_SECONDS = 2.0
STALE_SOURCE_SECONDS = 120

# The page every alert's runbook_url points into (each appends #<alert name in lower case>, the anchor a Markdown
# renderer gives the alert's heading in docs/operating.md). gpuscale has no public home to point at, so the default
# is a placeholder under the reserved .example domain: set it to where your copy of docs/operating.md is served
# (Helm: monitoring.prometheusRules.runbookBaseURL; kustomize and plain rule files: docs/operating.md, "Runbook
# links"). The chart rewrites the part of each runbook_url before the "#", so it follows this without a change.
RUNBOOK_PAGE = "https://gpuscale.example/docs/operating.md"


def _xid_classes(health: dict[str, Any]) -> dict[str, list[int]]:
    """policies/health.yaml's Xid table → the codes per alert class."""
    informational = set(health["finding_severity"]["informational_actions"])
    classes: dict[str, list[int]] = {"fatal": [], "application": [], "informational": [], "follow_up": []}
    for x in health["xids"]:
        if x["severity"] == "fatal":
            classes["fatal"].append(x["code"])
        elif x["action"] in informational:
            classes["informational"].append(x["code"])
        elif x["action"] == "RESTART_APP":
            classes["application"].append(x["code"])
        else:
            classes["follow_up"].append(x["code"])
    return classes


def _codes(codes: list[int]) -> str:
    return "|".join(str(c) for c in codes)


def _xid_expr(codes: list[int], *, known: list[int] | None = None) -> str:
    """Xids of one class seen in the last 10 minutes, per GPU and code (``known``: every code *not* in it).

    Two sources, either suffices: DCGM_EXP_XID_ERRORS_COUNT (dcgm-exporter's windowed count per ``xid``) and the
    last-Xid gauge DCGM_FI_DEV_XID_ERRORS (its ``err_code`` label), which only says a code is new when it was not
    the last one 15 minutes earlier (the gauge keeps the last Xid until the next one).
    """
    if known is None:
        xid, err = f'xid=~"{_codes(codes)}"', f'err_code=~"{_codes(codes)}"'
    else:  # err_code "0" is dcgm-exporter's "No Error"; a windowed series without `xid` means none in the window
        xid, err = f'xid!="", xid!~"{_codes(known)}"', f'err_code!~"{_codes([*known, 0])}"'
    windowed = f"max by ({GPU_POD}, xid) (max_over_time(DCGM_EXP_XID_ERRORS_COUNT{{{xid}}}[10m])) > 0"
    last = (
        f"max by ({GPU_POD}, xid) (label_replace(DCGM_FI_DEV_XID_ERRORS{{{err}}}"
        f' unless DCGM_FI_DEV_XID_ERRORS{{{err}}} offset 15m, "xid", "$1", "err_code", "(.+)"))'
    )
    return f"({windowed})\nor\n{last}"


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str, **labels: str) -> dict:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, **labels},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{RUNBOOK_PAGE}#{name.lower()}",
        },
    }


# The NVLink error counters deploy/dcgm-exporter/counters.csv enables, by the kind of error each counts.
NVLINK_ERROR_COUNTERS = {
    "crc_flit": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "crc_data": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "replay": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "recovery": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}


def _nvlink_errors_expr() -> str:
    """New NVLink errors per GPU over 15 minutes, all four counters summed.

    NB: not ``increase({__name__=~"…"}[15m])``: increase() drops the metric name, so a GPU exporting two of the
    counters gives two results with one label set and Prometheus refuses the whole rule ("vector cannot contain
    metrics with the same labelset"): it could never fire. Each counter's increase is tagged with an
    ``nvlink_error`` label instead, so ``or`` keeps all four; ``max`` folds duplicate scrapes of one counter (as the
    other GPU alerts do) before ``sum`` adds the kinds up.
    """
    tagged = "\n  or ".join(
        f'label_replace(increase({name}[15m]), "nvlink_error", "{kind}", "", "")'
        for kind, name in NVLINK_ERROR_COUNTERS.items()
    )
    return f"sum by ({GPU_POD}) (max by ({GPU_POD}, nvlink_error) (\n  {tagged}\n)) > 0"


# Which training job a pod belongs to, from kube-state-metrics (labels need --metric-labels-allowlist, see
# docs/operating.md): a JobSet, a Kubeflow training job, a Volcano job, else the batch Job that owns it. The first
# that names the pod wins (`or on (…)` keeps a later source only for pods no earlier one named).
JOB_MEMBERSHIP = """max by (cluster, namespace, pod, training_job) (
  label_replace(kube_pod_labels{label_jobset_sigs_k8s_io_jobset_name!=""}, "training_job", "$1", "label_jobset_sigs_k8s_io_jobset_name", "(.+)")
  or on (cluster, namespace, pod)
  label_replace(kube_pod_labels{label_training_kubeflow_org_job_name!=""}, "training_job", "$1", "label_training_kubeflow_org_job_name", "(.+)")
  or on (cluster, namespace, pod)
  label_replace(kube_pod_labels{label_volcano_sh_job_name!=""}, "training_job", "$1", "label_volcano_sh_job_name", "(.+)")
  or on (cluster, namespace, pod)
  label_replace(kube_pod_owner{owner_kind="Job"}, "training_job", "$1", "owner_name", "(.+)")
)"""


# A node's pool: the first pool label it carries, in the order of policies/pools.yaml's pool_labels (kube-state-metrics
# label names: non-alphanumerics become "_").
POOL_LABELS = (
    "karpenter_sh_nodepool",
    "cloud_google_com_gke_nodepool",
    "eks_amazonaws_com_nodegroup",
    "kubernetes_azure_com_agentpool",
    "node_kubernetes_io_instance_type",
)
NODE_POOL = (
    "max by (cluster, node, pool) (\n  "
    + "\n  or on (cluster, node)\n  ".join(
        f'label_replace(kube_node_labels{{label_{k}!=""}}, "pool", "$1", "label_{k}", "(.+)")' for k in POOL_LABELS
    )
    + "\n)"
)


def recording_rules() -> list[dict]:
    """Groups of recording rules: the catalogue's per-GPU signals and the training-job views the alerts use."""
    gpu = [
        {"record": "gpuscale:node_pool:info", "expr": NODE_POOL},
        {"record": "gpuscale:gpu_sm_active:ratio", "expr": f"max by ({GPU_POD}) (DCGM_FI_PROF_SM_ACTIVE)"},
        {"record": "gpuscale:gpu_tensor_active:ratio", "expr": f"max by ({GPU_POD}) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)"},
        {"record": "gpuscale:gpu_dram_active:ratio", "expr": f"max by ({GPU_POD}) (DCGM_FI_PROF_DRAM_ACTIVE)"},
        {"record": "gpuscale:gpu_utilization:percent", "expr": f"max by ({GPU_POD}) (DCGM_FI_DEV_GPU_UTIL)"},
        {
            "record": "gpuscale:gpu_interconnect_bytes:rate",
            "expr": f'sum by ({GPU_POD}) ({{__name__=~"DCGM_FI_PROF_(NVLINK|PCIE)_(TX|RX)_BYTES"}})',
        },
        {
            "record": "gpuscale:namespace_gpus_allocated:count",
            "expr": 'count by (cluster, namespace) (DCGM_FI_DEV_GPU_UTIL{pod!=""})',
        },
        {
            "record": "gpuscale:namespace_gpus_idle:count",
            "expr": f'count by (cluster, namespace) (DCGM_FI_PROF_SM_ACTIVE{{pod!=""}} < {IDLE_SM_ACTIVE})',
        },
    ]
    training = [
        {"record": "gpuscale:pod_training_job:info", "expr": JOB_MEMBERSHIP},
        {
            "record": "gpuscale:training_gpu_sm_active:ratio",
            "expr": "gpuscale:gpu_sm_active:ratio\n"
            "* on (cluster, namespace, pod) group_left (training_job) gpuscale:pod_training_job:info",
        },
        {
            "record": "gpuscale:training_gpu_interconnect_bytes:rate",
            "expr": "gpuscale:gpu_interconnect_bytes:rate\n"
            "* on (cluster, namespace, pod) group_left (training_job) gpuscale:pod_training_job:info",
        },
        {
            "record": "gpuscale:training_job_sm_active:max",
            "expr": f"max by ({JOB}) (gpuscale:training_gpu_sm_active:ratio)",
        },
        {
            "record": "gpuscale:training_job_sm_active:median",
            "expr": f"quantile by ({JOB}) (0.5, gpuscale:training_gpu_sm_active:ratio)",
        },
        {
            "record": "gpuscale:training_job_interconnect_bytes:rate",
            "expr": f"sum by ({JOB}) (gpuscale:training_gpu_interconnect_bytes:rate)",
        },
        {
            "record": "gpuscale:training_job_gpus:count",
            "expr": f"count by ({JOB}) (gpuscale:training_gpu_sm_active:ratio)",
        },
    ]
    return [
        {"name": "gpuscale-gpu.rules", "interval": "1m", "rules": gpu},
        {"name": "gpuscale-training.rules", "interval": "1m", "rules": training},
    ]


def alert_rules(health: dict[str, Any]) -> list[dict]:
    """Groups of alerts. Each names its subject in its labels (node and GPU, pod, job, model or source)."""
    xids = _xid_classes(health)
    gpu_where = "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on {{ $labels.Hostname }}"
    pod_where = "pod {{ $labels.namespace }}/{{ $labels.pod }}"
    hardware = [
        _alert(
            "GPUFatalXid",
            _xid_expr(xids["fatal"]),
            "0m",
            "critical",
            f"Fatal Xid {{{{ $labels.xid }}}} on {gpu_where}",
            f"{gpu_where} reported Xid {{{{ $labels.xid }}}} ({{{{ $value }}}} in the window), a fatal class "
            "(policies/health.yaml): drain the node, reset the GPU; the gpuscale controller cordons it if enabled.",
        ),
        _alert(
            "GPUXidApplicationFault",
            _xid_expr(xids["application"]),
            "0m",
            "warning",
            f"Xid {{{{ $labels.xid }}}} (application fault) on {gpu_where}",
            f"{gpu_where} reported Xid {{{{ $labels.xid }}}} while {pod_where} ran on it: restart the application; "
            "the GPU is fine unless it recurs across pods.",
        ),
        _alert(
            "GPUXidNeedsFollowUp",
            _xid_expr(xids["follow_up"]),
            "0m",
            "warning",
            f"Xid {{{{ $labels.xid }}}} on {gpu_where} points at an earlier error",
            f"{gpu_where} reported Xid {{{{ $labels.xid }}}}, which follows another Xid: look up the one before it.",
        ),
        _alert(
            "GPUXidInformational",
            _xid_expr(xids["informational"]),
            "0m",
            "info",
            f"Xid {{{{ $labels.xid }}}} (informational) on {gpu_where}",
            f"{gpu_where} reported Xid {{{{ $labels.xid }}}}, an event that needs no action by itself "
            "(e.g. 63: a row remap recorded, applied at the next reset).",
        ),
        _alert(
            "GPUXidUnknown",
            _xid_expr([], known=sorted(c for cs in xids.values() for c in cs)),
            "0m",
            "warning",
            f"Xid {{{{ $labels.xid }}}} on {gpu_where} is not in gpuscale's table",
            f"{gpu_where} reported Xid {{{{ $labels.xid }}}}; look it up in the NVIDIA Xid catalog "
            "(docs.nvidia.com/deploy/xid-errors) and add it to policies/health.yaml.",
        ),
        _alert(
            "GPUDoubleBitECCError",
            f"max by ({GPU_POD}) (increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[15m])) > 0",
            "0m",
            "critical",
            f"Uncorrectable (double-bit) ECC errors on {gpu_where}",
            f"{gpu_where} counted {{{{ $value | humanize }}}} new double-bit ECC errors in 15 minutes: drain and reset "
            "the GPU; request an RMA if they recur.",
        ),
        _alert(
            "GPURowRemapFailure",
            f"max by ({GPU_POD}) (DCGM_FI_DEV_ROW_REMAP_FAILURE) > 0",
            "2m",
            "critical",
            f"Row remapping failed on {gpu_where}",
            f"{gpu_where} reports a failed row remap (the Xid 64 class): drain, reset, and escalate if it persists.",
        ),
        _alert(
            "GPUUncorrectableRowsRemapped",
            f"max by ({GPU_POD}) (increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[30m])) > 0",
            "0m",
            "warning",
            f"Rows remapped for uncorrectable errors on {gpu_where}",
            f"{gpu_where} remapped {{{{ $value | humanize }}}} more rows for uncorrectable errors in 30 minutes; the "
            "remap takes effect at the next GPU reset.",
        ),
        _alert(
            "GPUThermalSlowdown",
            # clock event reasons: SW_THERMAL 0x20, HW_THERMAL 0x40
            f"max by ({GPU_POD}) ((floor(DCGM_FI_DEV_CLOCKS_EVENT_REASONS / 32) % 4) > 0)",
            "10m",
            "warning",
            f"Thermal clock slowdown on {gpu_where}",
            f"{gpu_where} has had its clocks cut for temperature for 10 minutes (reasons mask "
            "0x20/0x40 set): check cooling and airflow; jobs on it run slower than their peers.",
        ),
        _alert(
            "GPUHardwarePowerSlowdown",
            # clock event reasons: HW_SLOWDOWN 0x8, HW_POWER_BRAKE 0x80
            f"max by ({GPU_POD}) ((floor(DCGM_FI_DEV_CLOCKS_EVENT_REASONS / 8) % 2) + "
            "(floor(DCGM_FI_DEV_CLOCKS_EVENT_REASONS / 128) % 2) > 0)",
            "10m",
            "warning",
            f"Hardware slowdown or power brake on {gpu_where}",
            f"{gpu_where} has been in hardware slowdown (mask 0x8) or power-brake (0x80) for 10 minutes: a power "
            "supply, external power brake or overheating board.",
        ),
        _alert(
            "GPUNVLinkErrors",
            _nvlink_errors_expr(),
            "0m",
            "warning",
            f"NVLink errors on {gpu_where}",
            f"{gpu_where} counted {{{{ $value | humanize }}}} NVLink CRC/replay/recovery errors in 15 minutes: check "
            "the NVLink/NVSwitch fabric; Xid 74 alerts separately when a link fails.",
        ),
    ]
    efficiency = [
        _alert(
            "GPUUtilTrap",
            f"(max by ({GPU_POD}) (DCGM_FI_DEV_GPU_UTIL) > {UTIL_TRAP_UTIL})\n"
            f"and on ({GPU_POD}) (max by ({GPU_POD}) (DCGM_FI_PROF_SM_ACTIVE) < {UTIL_TRAP_SM})\n"
            f"and on ({GPU_POD}) (max by ({GPU_POD}) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE) < {UTIL_TRAP_TENSOR})",
            "30m",
            "info",
            f"{pod_where} looks busy by GPU_UTIL but its SMs are mostly idle",
            f"{gpu_where}: GPU_UTIL {{{{ $value }}}} % for 30 minutes while SM activity < {UTIL_TRAP_SM:.0%} and "
            f"tensor activity < {UTIL_TRAP_TENSOR:.0%}. GPU_UTIL only says a kernel was running; scale and size on "
            "SM activity (gpu_sm_active) instead.",
        ),
        _alert(
            "GPUAllocatedButIdle",
            f'max by ({GPU_POD}) (max_over_time(DCGM_FI_PROF_SM_ACTIVE{{pod!=""}}[1h])) < {IDLE_SM_ACTIVE}',
            "15m",
            "warning",
            f"{pod_where} holds a GPU it has not used for an hour",
            f"{gpu_where} is allocated to {pod_where} and its SM activity stayed below {IDLE_SM_ACTIVE:.0%} for over "
            "an hour: the GPU costs money and serves nobody. Ask the owner, or scale the workload down.",
        ),
    ]
    training = [
        _alert(
            "TrainingJobHung",
            f"(gpuscale:training_job_sm_active:max < {HUNG_SM_ACTIVE})\n"
            f"and on ({JOB}) (gpuscale:training_job_interconnect_bytes:rate < {HUNG_INTERCONNECT_BYTES:g})\n"
            f"and on ({JOB}) (max_over_time(gpuscale:training_job_sm_active:max[1h] offset 15m) > {BUSY_SM_ACTIVE})",
            "15m",
            "critical",
            "Training job {{ $labels.namespace }}/{{ $labels.training_job }} looks hung",
            "Every GPU of {{ $labels.namespace }}/{{ $labels.training_job }} has had SM activity below "
            f"{HUNG_SM_ACTIVE:.0%} (busiest {{{{ $value | humanizePercentage }}}}) and NVLink+PCIe traffic below "
            f"{HUNG_INTERCONNECT_BYTES / 1e6:g} MB/s for 15 minutes, after running above {BUSY_SM_ACTIVE:.0%}; its pods "
            "are still there. A rank is likely stuck in a collective: dump the stacks (py-spy dump, NCCL_DEBUG) and "
            "restart the job from its last checkpoint.",
        ),
        _alert(
            "TrainingJobStraggler",
            "(gpuscale:training_gpu_sm_active:ratio\n"
            f"  < on ({JOB}) group_left () ({STRAGGLER_RATIO} * gpuscale:training_job_sm_active:median))\n"
            f"and on ({JOB}) (gpuscale:training_job_sm_active:median > {BUSY_SM_ACTIVE})\n"
            f"and on ({JOB}) (gpuscale:training_job_gpus:count > 1)",
            "15m",
            "warning",
            "A rank of training job {{ $labels.namespace }}/{{ $labels.training_job }} straggles",
            f"{gpu_where} ({pod_where}) has had SM activity {{{{ $value | humanizePercentage }}}} for 15 minutes, "
            f"below {STRAGGLER_RATIO:.0%} of the job's median rank: check that GPU's clocks and Xids, its node's "
            "CPU/data loading and its network; the whole job runs at the slowest rank's pace.",
        ),
    ]
    inference = [
        _alert(
            "InferenceQueueTimeHigh",
            "sum by (cluster, namespace, pod, model) (rate(nv_inference_queue_duration_us[5m]))\n"
            "/ sum by (cluster, namespace, pod, model) (rate(nv_inference_request_success[5m])) / 1e6\n"
            f"> {QUEUE_TIME_SLO_SECONDS}",
            "5m",
            "warning",
            "Model {{ $labels.model }} in {{ $labels.namespace }}/{{ $labels.pod }}: requests queue too long",
            "Requests to {{ $labels.model }} wait {{ $value | humanizeDuration }} on average in Triton's queue "
            f"(SLO {QUEUE_TIME_SLO_SECONDS:g} s) for 5 minutes: the model needs more instances or replicas.",
        ),
        _alert(
            "InferenceRequestsWaiting",
            "sum by (cluster, namespace, model) (\n"
            '  label_replace({__name__=~"vllm:num_requests_waiting|num_requests_waiting"}, "model", "$1",'
            ' "model_name", "(.+)")\n'
            '  or label_replace(sglang:num_queue_reqs, "model", "$1", "model_name", "(.+)")\n'
            "  or nv_inference_pending_request_count\n"
            f") > {WAITING_REQUESTS_SLO}",
            "5m",
            "warning",
            "{{ $value }} requests wait for model {{ $labels.model }} in {{ $labels.namespace }}",
            "{{ $value }} requests have been waiting for a slot on {{ $labels.model }} "
            f"(namespace {{{{ $labels.namespace }}}}) for 5 minutes, above {WAITING_REQUESTS_SLO}: the HPA should be "
            "adding replicas; check its events and the gpuscale adapter.",
        ),
        _alert(
            "InferenceTTFTHigh",
            "histogram_quantile(0.99, sum by (cluster, namespace, model_name, le) (\n"
            '  rate({__name__=~"vllm:time_to_first_token_seconds_bucket|time_to_first_token_seconds_bucket"}[5m])'
            "\n))\n"
            f"> {TTFT_P99_SLO_SECONDS}",
            "10m",
            "warning",
            "p99 time to first token of {{ $labels.model_name }} is {{ $value | humanizeDuration }}",
            "p99 TTFT of {{ $labels.model_name }} in {{ $labels.namespace }} has been {{ $value | humanizeDuration }} "
            f"for 10 minutes (SLO {TTFT_P99_SLO_SECONDS:g} s): prefill is queued or preempted; add replicas or cut "
            "max batch size.",
        ),
    ]
    gpuscale = [
        _alert(
            "GpuscaleSourceStale",
            f"max by (cluster, namespace, pod, source, target) (gpuscale_source_freshness_seconds) > {STALE_SOURCE_SECONDS}",
            "3m",
            "warning",
            "gpuscale's data from {{ $labels.target }} is {{ $value | humanizeDuration }} old",
            "The adapter {{ $labels.namespace }}/{{ $labels.pod }} last read {{ $labels.source }} target "
            "{{ $labels.target }} {{ $value | humanizeDuration }} ago: metrics from it are answered 503 and HPAs "
            "on them hold their size.",
        ),
        _alert(
            "GpuscaleSourceFailing",
            "(max by (cluster, namespace, pod, source, target) (gpuscale_source_target_up) == 0)\n"
            "or (max by (cluster, namespace, pod, source, target) (gpuscale_controller_source_up) == 0)",
            "5m",
            "warning",
            "gpuscale cannot read {{ $labels.source }} {{ $labels.target }}",
            "{{ $labels.namespace }}/{{ $labels.pod }} has failed to read {{ $labels.source }} target "
            "{{ $labels.target }} for 5 minutes; see gpuscale_source_target_last_error_timestamp_seconds for the "
            "reason, or the pod's log.",
        ),
        _alert(
            "GpuscaleBreakerOpen",
            "max by (cluster, namespace, pod) (gpuscale_controller_held_back_nodes) > 0",
            "5m",
            "warning",
            "gpuscale's circuit breaker holds back remediation of {{ $value }} nodes",
            "The controller {{ $labels.namespace }}/{{ $labels.pod }} sees problems on {{ $value }} GPU nodes but "
            "its breaker stops it from cordoning more: too many at once usually means a fleet-wide cause (driver, "
            "fabric, exporter). Look before raising the limit.",
        ),
        _alert(
            "GpuscaleReconcileFailing",
            "sum by (cluster, namespace, pod, stage) (increase(gpuscale_controller_reconcile_failures_total[10m])) > 0",
            "5m",
            "warning",
            "gpuscale controller reconciles fail at {{ $labels.stage }}",
            "{{ $labels.namespace }}/{{ $labels.pod }} failed {{ $value | humanize }} reconciles at stage "
            "{{ $labels.stage }} in 10 minutes; its log says why.",
        ),
        _alert(
            "GpuscaleHPAMetricMissing",
            'max by (cluster, namespace, horizontalpodautoscaler) (kube_horizontalpodautoscaler_status_condition{condition="ScalingActive", status="false"}) == 1',
            "5m",
            "warning",
            "HPA {{ $labels.namespace }}/{{ $labels.horizontalpodautoscaler }} cannot read its metric",
            "The HorizontalPodAutoscaler {{ $labels.namespace }}/{{ $labels.horizontalpodautoscaler }} has had "
            "ScalingActive=False for 5 minutes: it cannot fetch its metric and holds its size. `kubectl describe "
            "hpa` names the metric; `kubectl get --raw /apis/custom.metrics.k8s.io/v1beta2` shows what gpuscale "
            "serves.",
        ),
    ]
    return [
        {"name": "gpuscale-gpu-health", "rules": hardware},
        {"name": "gpuscale-gpu-efficiency", "rules": efficiency},
        {"name": "gpuscale-training", "rules": training},
        {"name": "gpuscale-inference", "rules": inference},
        {"name": "gpuscale-self", "rules": gpuscale},
    ]


# Catalogue metrics the adapter can read from the recording rules instead of the raw DCGM series.
RECORDED_METRICS = {
    "gpu_utilization": "gpuscale:gpu_utilization:percent",
    "gpu_sm_active": "gpuscale:gpu_sm_active:ratio",
    "gpu_tensor_active": "gpuscale:gpu_tensor_active:ratio",
    "gpu_dram_active": "gpuscale:gpu_dram_active:ratio",
}


def catalogue_on_recorded_series(catalogue: dict[str, Any]) -> dict[str, Any]:
    """policies/metrics.yaml with RECORDED_METRICS read from their recording rules (a `prometheus:` override).

    ``+ 0`` drops the recorded name, so the adapter files each value under the term's DCGM series as it does for the
    raw query; the recorded series keep every label attribution reads (GPU, MIG instance, pod, container).
    """
    out = {**catalogue, "metrics": []}
    for metric in catalogue["metrics"]:
        record = RECORDED_METRICS.get(metric["name"])
        if record is not None:
            metric = {k: v for k, v in metric.items() if k != "series"}
            metric["numerator"] = {"series": catalogue_series(catalogue, metric["name"]), "prometheus": f"{record} + 0"}
        out["metrics"].append(metric)
    return out


def catalogue_series(catalogue: dict[str, Any], name: str) -> list[str]:
    (metric,) = [m for m in catalogue["metrics"] if m["name"] == name]
    return metric["series"]


def load_health(root: Path) -> dict[str, Any]:
    return yaml.safe_load((root / "policies" / "health.yaml").read_text())
