"""gpuscale's Grafana dashboards, built with grafana-foundation-sdk (Grafana Labs' typed builders).

One function per dashboard; each panel says in its description which question it answers. Queries read only what
dcgm-exporter, the inference servers gpuscale's catalogue knows, kube-state-metrics and gpuscale itself export,
plus two recording rules of deploy/alerts (a pod's training job, a node's pool): tests/operating runs every query
against a real Prometheus loaded with the test fleet and fails on an unknown metric or an empty panel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef, GridPos, VariableRefresh
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
ALL = ".*"

# Selectors per template variable. `=~".*"` also matches a missing label, so a Prometheus without a `cluster`
# label, or a GPU no pod holds (no namespace), still shows.
GPU_SEL = 'cluster=~"$cluster", namespace=~"$namespace", Hostname=~"$node"'
NS_SEL = 'cluster=~"$cluster", namespace=~"$namespace"'
POOLS = 'label_replace(gpuscale:node_pool:info{cluster=~"$cluster", pool=~"$pool"}, "Hostname", "$1", "node", "(.+)")'
JOBS = 'gpuscale:pod_training_job:info{cluster=~"$cluster", namespace=~"$namespace", training_job=~"$job"}'
INTERCONNECT = '{__name__=~"DCGM_FI_PROF_NVLINK_(TX|RX)_BYTES", %s}'
SERVER_MODELS = "nv_inference_request_success|vllm:request_success_total|request_success_total"


@dataclass
class Panel:
    kind: str  # timeseries | stat | table
    title: str
    description: str
    queries: Sequence[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    width: int = 12
    height: int = 8
    instant: bool = False


def ts(title: str, description: str, *queries: tuple[str, str], unit: str = "short", width: int = 12) -> Panel:
    return Panel("timeseries", title, description, queries, unit=unit, width=width)


def st(title: str, description: str, query: str, *, unit: str = "short", width: int = 6) -> Panel:
    return Panel("stat", title, description, [(query, "")], unit=unit, width=width, height=4, instant=True)


def tb(title: str, description: str, query: str, *, unit: str = "short", width: int = 12) -> Panel:
    return Panel("table", title, description, [(query, "")], unit=unit, width=width, instant=True)


def _variable(name: str, label: str, query: str, regex: str = "") -> dashboard.QueryVariable:
    v = (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query(query)
        .multi(True)
        .include_all(True)
        .all_value(ALL)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
    )
    if regex:
        v = v.regex(regex)
    return v


VARIABLES = {
    "cluster": lambda: _variable("cluster", "Cluster", "label_values(DCGM_FI_DEV_GPU_UTIL, cluster)"),
    "namespace": lambda: _variable(
        "namespace", "Namespace", 'label_values(DCGM_FI_DEV_GPU_UTIL{cluster=~"$cluster"}, namespace)'
    ),
    "pool": lambda: _variable("pool", "Pool", 'label_values(gpuscale:node_pool:info{cluster=~"$cluster"}, pool)'),
    "node": lambda: _variable("node", "Node", 'label_values(DCGM_FI_DEV_GPU_UTIL{cluster=~"$cluster"}, Hostname)'),
    "model": lambda: _variable(
        "model",
        "Model",
        f'query_result(count by (model, model_name) ({{__name__=~"{SERVER_MODELS}", {NS_SEL}}}))',
        regex='/model(?:_name)?="([^"]+)"/',
    ),
    "job": lambda: _variable(
        "job",
        "Training job",
        'label_values(gpuscale:pod_training_job:info{cluster=~"$cluster", namespace=~"$namespace"}, training_job)',
    ),
}


def _build_panel(p: Panel, panel_id: int, x: int, y: int):
    builder = {"timeseries": timeseries.Panel, "stat": stat.Panel, "table": table.Panel}[p.kind]()
    b = builder.id(panel_id).title(p.title).description(p.description).datasource(DS).unit(p.unit)
    b = b.grid_pos(GridPos(x=x, y=y, w=p.width, h=p.height))
    for i, (expr, legend) in enumerate(p.queries):
        q = prometheus.Dataquery().expr(expr).ref_id(chr(ord("A") + i))
        if legend:
            q = q.legend_format(legend)
        if p.instant:
            q = q.instant().format(PromQueryFormat.TABLE) if p.kind == "table" else q.instant()
        else:
            q = q.range()
        b = b.with_target(q)
    return b


def build(uid: str, title: str, description: str, variables: Sequence[str], rows: Sequence[tuple[str, list]]):
    d = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["gpuscale", "gpu"])
        .editable()
        .refresh("1m")
        .time("now-3h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    for name in variables:
        d = d.with_variable(VARIABLES[name]())
    panel_id, y = 1, 0
    for row_title, panels in rows:
        d = d.with_row(dashboard.Row(row_title).id(panel_id).grid_pos(GridPos(x=0, y=y, w=24, h=1)))
        panel_id, y, x, line = panel_id + 1, y + 1, 0, 0
        for p in panels:
            if x + p.width > 24:
                x, y, line = 0, y + line, 0
            d = d.with_panel(_build_panel(p, panel_id, x, y))
            panel_id, x, line = panel_id + 1, x + p.width, max(line, p.height)
        y += line
    return d.build()


# --- the dashboards ---------------------------------------------------------------------------------------------


def fleet():
    gpus = f"DCGM_FI_DEV_GPU_UTIL{{{GPU_SEL}}}"
    by_pool = f"{gpus} * on (cluster, Hostname) group_left (pool) {POOLS}"
    return build(
        "gpuscale-fleet",
        "GPU fleet",
        "Capacity, allocation and real activity of every GPU, by pool and product.",
        ["cluster", "pool", "namespace", "node"],
        [
            (
                "Now",
                [
                    st("GPUs", "How many GPUs report to dcgm-exporter.", f"count({gpus})"),
                    st(
                        "Allocated",
                        "GPUs a pod holds (dcgm-exporter's pod label).",
                        f'count(DCGM_FI_DEV_GPU_UTIL{{{GPU_SEL}, pod!=""}}) or vector(0)',
                    ),
                    st(
                        "Active (SM > 10 %)",
                        "GPUs whose SMs are actually busy: allocated is not used.",
                        f"count(DCGM_FI_PROF_SM_ACTIVE{{{GPU_SEL}}} > 0.1) or vector(0)",
                    ),
                    st(
                        "Fleet SM activity",
                        "Mean share of SM cycles with a warp resident, over every GPU.",
                        f"avg(DCGM_FI_PROF_SM_ACTIVE{{{GPU_SEL}}})",
                        unit="percentunit",
                    ),
                ],
            ),
            (
                "Capacity and allocation",
                [
                    ts(
                        "Allocated vs active GPUs",
                        "The gap between the two lines is paid-for capacity doing nothing.",
                        (f"count({gpus})", "capacity"),
                        (f'count(DCGM_FI_DEV_GPU_UTIL{{{GPU_SEL}, pod!=""}})', "allocated"),
                        (f"count(DCGM_FI_PROF_SM_ACTIVE{{{GPU_SEL}}} > 0.1) or vector(0)", "active (SM > 10 %)"),
                    ),
                    ts(
                        "GPUs by pool and product",
                        "Where the capacity is: node pool (Karpenter/GKE/EKS/AKS label) and GPU model.",
                        (f"count by (pool, modelName) ({by_pool})", "{{pool}} {{modelName}}"),
                    ),
                    ts(
                        "SM activity by pool",
                        "Which pools do real work; a low pool is a candidate to shrink.",
                        (
                            f"avg by (pool) (DCGM_FI_PROF_SM_ACTIVE{{{GPU_SEL}}}"
                            f" * on (cluster, Hostname) group_left (pool) {POOLS})",
                            "{{pool}}",
                        ),
                        unit="percentunit",
                    ),
                    ts(
                        "Allocated GPUs by namespace",
                        "Who holds the GPUs.",
                        (f'count by (namespace) (DCGM_FI_DEV_GPU_UTIL{{{GPU_SEL}, pod!=""}})', "{{namespace}}"),
                    ),
                    ts(
                        "GPU nodes per pool (controller)",
                        "Nodes gpuscale's controller counts in each pool.",
                        ('gpuscale_controller_pool_nodes{cluster=~"$cluster", pool=~"$pool"}', "{{pool}}"),
                    ),
                    ts(
                        "Framebuffer in use",
                        "GPU memory held, across the fleet.",
                        (f"sum(DCGM_FI_DEV_FB_USED{{{GPU_SEL}}}) * 1048576", "used"),
                        (
                            f"sum(DCGM_FI_DEV_FB_USED{{{GPU_SEL}}} + DCGM_FI_DEV_FB_FREE{{{GPU_SEL}}}) * 1048576",
                            "total",
                        ),
                        unit="bytes",
                    ),
                ],
            ),
        ],
    )


def hardware():
    per_gpu = "{{Hostname}} GPU {{gpu}}"
    return build(
        "gpuscale-gpu-hardware",
        "GPU hardware",
        "Per GPU: GPU_UTIL beside SM, tensor and DRAM activity (the util trap), memory, power, heat, clocks and "
        "throttling, NVLink and PCIe.",
        ["cluster", "namespace", "node"],
        [
            (
                "Activity: util is not usage",
                [
                    ts(
                        "GPU_UTIL vs SM, tensor and DRAM activity",
                        "GPU_UTIL only says a kernel was running; a GPU at 100 % util with 30 % SM activity has room "
                        "for three times the work. Scale and size on SM activity.",
                        (f"avg(DCGM_FI_DEV_GPU_UTIL{{{GPU_SEL}}}) / 100", "GPU_UTIL"),
                        (f"avg(DCGM_FI_PROF_SM_ACTIVE{{{GPU_SEL}}})", "SM active"),
                        (f"avg(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{GPU_SEL}}})", "tensor active"),
                        (f"avg(DCGM_FI_PROF_DRAM_ACTIVE{{{GPU_SEL}}})", "DRAM active"),
                        unit="percentunit",
                        width=24,
                    ),
                    ts(
                        "Util trap: GPU_UTIL minus SM activity",
                        "Per GPU, how much GPU_UTIL overstates the work done; large and sustained is the trap.",
                        (
                            f"DCGM_FI_DEV_GPU_UTIL{{{GPU_SEL}}} / 100 - on (Hostname, gpu, UUID) "
                            f"DCGM_FI_PROF_SM_ACTIVE{{{GPU_SEL}}}",
                            per_gpu,
                        ),
                        unit="percentunit",
                    ),
                    ts(
                        "SM activity per GPU",
                        "Share of cycles with at least one warp resident.",
                        (f"DCGM_FI_PROF_SM_ACTIVE{{{GPU_SEL}}}", per_gpu),
                        unit="percentunit",
                    ),
                    ts(
                        "Tensor pipe activity per GPU",
                        "Matrix math actually issued: what training and LLM prefill should keep high.",
                        (f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{GPU_SEL}}}", per_gpu),
                        unit="percentunit",
                    ),
                    ts(
                        "DRAM activity per GPU",
                        "Memory-interface busy share (~0.8 is the practical peak): decode-heavy LLMs live here.",
                        (f"DCGM_FI_PROF_DRAM_ACTIVE{{{GPU_SEL}}}", per_gpu),
                        unit="percentunit",
                    ),
                ],
            ),
            (
                "Memory, power, heat, clocks",
                [
                    ts(
                        "Framebuffer used per GPU",
                        "GPU memory held; near the total means no room for a bigger batch.",
                        (f"DCGM_FI_DEV_FB_USED{{{GPU_SEL}}} * 1048576", per_gpu),
                        unit="bytes",
                    ),
                    ts(
                        "Power draw vs limit",
                        "Watts per GPU against its power-management limit.",
                        (f"DCGM_FI_DEV_POWER_USAGE{{{GPU_SEL}}}", per_gpu),
                        (f"max(DCGM_FI_DEV_POWER_MGMT_LIMIT{{{GPU_SEL}}})", "limit"),
                        unit="watt",
                    ),
                    ts(
                        "GPU and memory temperature",
                        "°C; HBM above ~95 °C and cores above ~87 °C start thermal slowdowns.",
                        (f"DCGM_FI_DEV_GPU_TEMP{{{GPU_SEL}}}", per_gpu + " core"),
                        (f"DCGM_FI_DEV_MEMORY_TEMP{{{GPU_SEL}}}", per_gpu + " memory"),
                        unit="celsius",
                    ),
                    ts(
                        "SM clock",
                        "MHz; a GPU clocked below its peers is throttled (see the reasons).",
                        (f"DCGM_FI_DEV_SM_CLOCK{{{GPU_SEL}}}", per_gpu),
                        unit="rotmhz",
                    ),
                    ts(
                        "Clock events by reason",
                        "dcgm-exporter's count of clock-event reasons in its window: power_cap, sw_thermal, "
                        "hw_slowdown…",
                        (f"DCGM_EXP_CLOCK_EVENTS_COUNT{{{GPU_SEL}}}", per_gpu + " {{clock_event}}"),
                    ),
                    ts(
                        "Time throttled by power and temperature",
                        "Microseconds per second the GPU spent clocked down by a power or thermal limit.",
                        (f"rate(DCGM_FI_DEV_POWER_VIOLATION{{{GPU_SEL}}}[5m])", per_gpu + " power"),
                        (f"rate(DCGM_FI_DEV_THERMAL_VIOLATION{{{GPU_SEL}}}[5m])", per_gpu + " thermal"),
                        unit="µs",
                    ),
                ],
            ),
            (
                "Interconnect",
                [
                    ts(
                        "NVLink traffic per GPU",
                        "Bytes per second sent and received over NVLink: collectives of multi-GPU jobs.",
                        (f"DCGM_FI_PROF_NVLINK_TX_BYTES{{{GPU_SEL}}}", per_gpu + " tx"),
                        (f"DCGM_FI_PROF_NVLINK_RX_BYTES{{{GPU_SEL}}}", per_gpu + " rx"),
                        unit="Bps",
                    ),
                    ts(
                        "PCIe traffic per GPU",
                        "Bytes per second over PCIe: input pipelines, host offload, cross-node traffic without "
                        "GPUDirect.",
                        (f"DCGM_FI_PROF_PCIE_TX_BYTES{{{GPU_SEL}}}", per_gpu + " tx"),
                        (f"DCGM_FI_PROF_PCIE_RX_BYTES{{{GPU_SEL}}}", per_gpu + " rx"),
                        unit="Bps",
                    ),
                ],
            ),
        ],
    )


def health():
    per_gpu = "{{Hostname}} GPU {{gpu}}"
    return build(
        "gpuscale-gpu-health",
        "GPU health",
        "Xids by meaning, ECC, row remaps, throttling and what gpuscale's controller did about them.",
        ["cluster", "namespace", "node"],
        [
            (
                "Errors",
                [
                    tb(
                        "Xids in the time range",
                        "Every Xid dcgm-exporter counted, per GPU and code (meaning and action: docs/operating.md, "
                        "policies/health.yaml).",
                        f'max by (Hostname, gpu, xid, namespace, pod) (max_over_time(DCGM_EXP_XID_ERRORS_COUNT{{{GPU_SEL}, xid!=""}}[$__range]))',
                    ),
                    tb(
                        "Last Xid per GPU",
                        "The last Xid each GPU reported (kept until the next one or an exporter restart), with "
                        "dcgm-exporter's text.",
                        f"max by (Hostname, gpu, err_code, err_msg) (DCGM_FI_DEV_XID_ERRORS{{{GPU_SEL}}} > 0)",
                    ),
                    ts(
                        "ECC errors (volatile, since driver load)",
                        "Double-bit (uncorrectable) errors mean drain and reset; single-bit ones are corrected.",
                        (f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{GPU_SEL}}}", per_gpu + " double-bit"),
                        (f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{GPU_SEL}}}", per_gpu + " single-bit"),
                    ),
                    ts(
                        "Remapped rows",
                        "Rows remapped for uncorrectable and correctable errors, and remap failures (Xid 64 class).",
                        (f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{GPU_SEL}}}", per_gpu + " uncorrectable"),
                        (f"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{GPU_SEL}}}", per_gpu + " correctable"),
                        (f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{GPU_SEL}}}", per_gpu + " failure"),
                    ),
                    ts(
                        "Clock-event reasons mask",
                        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS: 0x4 power cap, 0x8 hardware slowdown, 0x20 software "
                        "thermal, 0x40 hardware thermal, 0x80 power brake.",
                        (f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{GPU_SEL}}}", per_gpu),
                    ),
                    ts(
                        "PCIe replays",
                        "Link-level retries per second; a rising rate is a bad riser, slot or cable.",
                        (f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{GPU_SEL}}}[5m])", per_gpu),
                    ),
                ],
            ),
            (
                "What gpuscale's controller did",
                [
                    st(
                        "Nodes under remediation",
                        "GPU nodes the controller has cordoned or tainted now.",
                        'sum(gpuscale_controller_remediated_nodes{cluster=~"$cluster"})',
                    ),
                    st(
                        "Held back by the breaker",
                        "Nodes with a problem the circuit breaker does not let it touch.",
                        'sum(gpuscale_controller_held_back_nodes{cluster=~"$cluster"})',
                    ),
                    st(
                        "Nodes reporting telemetry",
                        "GPU nodes whose exporter answered the controller's last read.",
                        'sum(gpuscale_controller_telemetry_nodes{cluster=~"$cluster", reporting="true"})',
                    ),
                    st(
                        "Dry run",
                        "1: the controller only validates its writes (dryRun=All).",
                        'max(gpuscale_controller_dry_run{cluster=~"$cluster"})',
                    ),
                    ts(
                        "Controller actions",
                        "Kubernetes writes per planner, action and result (applied, dry-run, refused, failed).",
                        (
                            'sum by (planner, action, result) (increase(gpuscale_controller_actions_total{cluster=~"$cluster"}[5m]))',
                            "{{planner}} {{action}} {{result}}",
                        ),
                        width=24,
                    ),
                ],
            ),
        ],
    )


def inference():
    def p99(name: str, by: str = "model_name") -> str:
        return f'histogram_quantile(0.99, sum by (le, {by}) (rate({name}_bucket{{{NS_SEL}, {by}=~"$model"}}[5m])))'

    return build(
        "gpuscale-inference",
        "Inference",
        "Per model: request rate, queue time vs compute time, latency, KV cache, waiting requests and what the "
        "HorizontalPodAutoscaler decided.",
        ["cluster", "namespace", "model"],
        [
            (
                "Traffic and latency",
                [
                    ts(
                        "Requests per second",
                        "Finished requests per model (Triton success, vLLM and NIM every finish reason).",
                        (
                            f'sum by (model) (rate(nv_inference_request_success{{{NS_SEL}, model=~"$model"}}[5m]))',
                            "triton {{model}}",
                        ),
                        (
                            f'sum by (model_name) (rate(vllm:request_success_total{{{NS_SEL}, model_name=~"$model"}}[5m]))',
                            "vllm {{model_name}}",
                        ),
                        (
                            f'sum by (model_name) (rate(request_success_total{{{NS_SEL}, model_name=~"$model"}}[5m]))',
                            "nim {{model_name}}",
                        ),
                        unit="reqps",
                    ),
                    ts(
                        "Queue time vs compute time (Triton)",
                        "Mean time a request waits in the scheduler queue vs runs inference: queue above compute "
                        "means the model needs more instances.",
                        (
                            f'sum by (model) (rate(nv_inference_queue_duration_us{{{NS_SEL}, model=~"$model"}}[5m]))'
                            f' / sum by (model) (rate(nv_inference_request_success{{{NS_SEL}, model=~"$model"}}[5m])) / 1e6',
                            "{{model}} queue",
                        ),
                        (
                            f'sum by (model) (rate(nv_inference_compute_infer_duration_us{{{NS_SEL}, model=~"$model"}}[5m]))'
                            f' / sum by (model) (rate(nv_inference_request_success{{{NS_SEL}, model=~"$model"}}[5m])) / 1e6',
                            "{{model}} compute",
                        ),
                        unit="s",
                    ),
                    ts(
                        "p99 time to first token",
                        "The prefill latency users feel first (vLLM, NIM).",
                        (p99("vllm:time_to_first_token_seconds"), "vllm {{model_name}}"),
                        (p99("time_to_first_token_seconds"), "nim {{model_name}}"),
                        unit="s",
                    ),
                    ts(
                        "p99 inter-token latency",
                        "Decode speed per stream (vLLM).",
                        (p99("vllm:inter_token_latency_seconds"), "vllm {{model_name}}"),
                        unit="s",
                    ),
                ],
            ),
            (
                "Capacity and scaling",
                [
                    ts(
                        "Waiting requests",
                        "Requests queued for a slot: what gpuscale's inference_queue_depth serves to the HPA.",
                        (
                            f'sum by (model) (nv_inference_pending_request_count{{{NS_SEL}, model=~"$model", gpu_uuid=""}})',
                            "triton {{model}}",
                        ),
                        (
                            f'sum by (model_name) (vllm:num_requests_waiting{{{NS_SEL}, model_name=~"$model"}})',
                            "vllm {{model_name}}",
                        ),
                        (
                            f'sum by (model_name) (num_requests_waiting{{{NS_SEL}, model_name=~"$model"}})',
                            "nim {{model_name}}",
                        ),
                    ),
                    ts(
                        "KV cache usage",
                        "Share of the KV cache in use; near 1 the server preempts and queues.",
                        (
                            f'max by (model_name) (vllm:kv_cache_usage_perc{{{NS_SEL}, model_name=~"$model"}})',
                            "vllm {{model_name}}",
                        ),
                        (
                            f'max by (model_name) (gpu_cache_usage_perc{{{NS_SEL}, model_name=~"$model"}})',
                            "nim {{model_name}}",
                        ),
                        unit="percentunit",
                    ),
                    ts(
                        "Failed requests",
                        "Triton failures per second by reason (REJECTED: queue full; CANCELED: client gave up).",
                        (
                            f'sum by (model, reason) (rate(nv_inference_request_failure{{{NS_SEL}, model=~"$model"}}[5m]))',
                            "{{model}} {{reason}}",
                        ),
                        unit="reqps",
                    ),
                    ts(
                        "What the HPA decided",
                        "Desired vs current replicas of every HorizontalPodAutoscaler (kube-state-metrics).",
                        (
                            f"kube_horizontalpodautoscaler_status_desired_replicas{{{NS_SEL}}}",
                            "{{horizontalpodautoscaler}} desired",
                        ),
                        (
                            f"kube_horizontalpodautoscaler_status_current_replicas{{{NS_SEL}}}",
                            "{{horizontalpodautoscaler}} current",
                        ),
                    ),
                ],
            ),
        ],
    )


def training():
    def ranked(expr: str) -> str:
        return f"{expr} * on (cluster, namespace, pod) group_left (training_job) {JOBS}"

    sm = ranked(f"DCGM_FI_PROF_SM_ACTIVE{{{NS_SEL}}}")
    per_rank = "{{training_job}} {{pod}} GPU {{gpu}}"
    return build(
        "gpuscale-training",
        "Training jobs",
        "Per job (JobSet, Kubeflow, Volcano or batch Job): SM activity per rank, NVLink traffic, and the hang and "
        "straggler views the TrainingJobHung / TrainingJobStraggler alerts use.",
        ["cluster", "namespace", "job"],
        [
            (
                "Ranks",
                [
                    st("GPUs in the job", "Ranks (GPUs) of the selected jobs.", f"count({sm})"),
                    st(
                        "Job SM activity",
                        "Mean SM activity over the job's GPUs.",
                        f"avg({sm})",
                        unit="percentunit",
                    ),
                    st(
                        "Slowest rank vs median",
                        "The least active rank's SM activity as a share of the job's median: below 0.6 for 15 "
                        "minutes is a straggler.",
                        f"min({sm}) / quantile(0.5, {sm})",
                        unit="percentunit",
                    ),
                    st(
                        "NVLink traffic",
                        "Bytes per second over NVLink, summed over the job's GPUs.",
                        f"sum({ranked(f'sum by (cluster, namespace, pod, Hostname, gpu) ({INTERCONNECT % NS_SEL})')})",
                        unit="Bps",
                    ),
                    ts(
                        "SM activity per rank",
                        "Every rank should move together; one line apart is a straggler, all lines flat near 0 a hang.",
                        (sm, per_rank),
                        unit="percentunit",
                    ),
                    ts(
                        "Tensor activity per rank",
                        "Matrix math per rank.",
                        (ranked(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{NS_SEL}}}"), per_rank),
                        unit="percentunit",
                    ),
                    ts(
                        "NVLink traffic per rank",
                        "Collectives (all-reduce, all-gather) as bytes per second; zero while SMs are idle is a "
                        "job stuck in a collective.",
                        (
                            ranked(f"sum by (cluster, namespace, pod, Hostname, gpu) ({INTERCONNECT % NS_SEL})"),
                            per_rank,
                        ),
                        unit="Bps",
                    ),
                    ts(
                        "PCIe traffic per rank",
                        "Input pipeline and cross-node traffic without GPUDirect.",
                        (
                            ranked(
                                f"DCGM_FI_PROF_PCIE_TX_BYTES{{{NS_SEL}}} + on (cluster, namespace, pod, Hostname, gpu, UUID) "
                                f"DCGM_FI_PROF_PCIE_RX_BYTES{{{NS_SEL}}}"
                            ),
                            per_rank,
                        ),
                        unit="Bps",
                    ),
                ],
            ),
            (
                "Hang and straggler",
                [
                    ts(
                        "Hang: busiest GPU per job",
                        "A hung job has its busiest GPU below 5 % SM activity (and NVLink+PCIe near zero: the panels above) while its "
                        "pods still run (TrainingJobHung fires after 15 minutes).",
                        (f"max by (namespace, training_job) ({sm})", "{{training_job}} busiest SM"),
                        unit="percentunit",
                    ),
                    ts(
                        "Straggler: each rank vs its job's median",
                        "SM activity of each rank divided by the job's median rank; below 0.6 for 15 minutes is a "
                        "straggler (TrainingJobStraggler).",
                        (
                            f"{sm} / on (cluster, namespace, training_job) group_left () "
                            f"quantile by (cluster, namespace, training_job) (0.5, {sm})",
                            per_rank,
                        ),
                        unit="percentunit",
                    ),
                ],
            ),
        ],
    )


def cost():
    idle = f'DCGM_FI_PROF_SM_ACTIVE{{{GPU_SEL}, pod!=""}} < 0.01'
    return build(
        "gpuscale-cost",
        "GPU cost",
        "GPUs held and idle: idle GPU-hours by namespace and owner.",
        ["cluster", "namespace", "node"],
        [
            (
                "Idle GPUs",
                [
                    st(
                        "Idle GPU-hours (controller)",
                        "GPU-hours requested but idle in the time range, as gpuscale's controller counts them.",
                        'sum(increase(gpuscale_controller_idle_gpu_seconds_total{cluster=~"$cluster"}[$__range])) / 3600',
                        unit="h",
                    ),
                    st(
                        "Allocated GPUs idle now",
                        "GPUs a pod holds whose SM activity is below 1 %.",
                        f"count({idle}) or vector(0)",
                    ),
                    st(
                        "Idle GPUs (controller)",
                        "GPUs the controller sees requested but idle for its idle window.",
                        # NB: the gauge has a series per node only while that node has idle GPUs; without
                        # `or vector(0)` the panel says "No data" when none is idle (sum() has no grouping, so
                        # vector(0)'s empty label set is exactly the one it stands in for).
                        'sum(gpuscale_controller_idle_gpus{cluster=~"$cluster"}) or vector(0)',
                    ),
                    st(
                        "Allocated GPUs",
                        "GPUs a pod holds now.",
                        f'count(DCGM_FI_DEV_GPU_UTIL{{{GPU_SEL}, pod!=""}}) or vector(0)',
                    ),
                    tb(
                        "Idle GPU-hours by namespace",
                        "Allocated-but-idle GPU-hours in the time range, per namespace (1-minute resolution).",
                        f"sum by (namespace) (count_over_time(({idle})[$__range:1m])) / 60",
                        unit="h",
                    ),
                    tb(
                        "Idle GPU-hours by owner",
                        "The same by the pod's owner (Deployment's ReplicaSet, StatefulSet, Job…), from "
                        "kube-state-metrics kube_pod_owner.",
                        "sum by (namespace, owner_kind, owner_name) (count_over_time(("
                        f"({idle}) * on (cluster, namespace, pod) group_left (owner_kind, owner_name) "
                        f"kube_pod_owner{{{NS_SEL}}})[$__range:1m])) / 60",
                        unit="h",
                    ),
                    ts(
                        "Idle allocated GPUs by namespace",
                        "How many held GPUs sit idle, over time.",
                        (f"count by (namespace) ({idle})", "{{namespace}}"),
                    ),
                    ts(
                        "Idle GPUs per node (controller)",
                        "Requested but idle for the controller's idle window.",
                        ('gpuscale_controller_idle_gpus{cluster=~"$cluster", node=~"$node"}', "{{node}}"),
                    ),
                ],
            ),
        ],
    )


def gpuscale_self():
    sel = 'cluster=~"$cluster"'
    return build(
        "gpuscale-self",
        "gpuscale",
        "gpuscale itself: how fresh its data is, its sources' errors, how fast it answers the HPA, and the "
        "controller's breaker and reconciles.",
        ["cluster"],
        [
            (
                "Adapter",
                [
                    ts(
                        "Refresh age",
                        "Seconds since the adapter last completed a refresh; values older than max_age are "
                        "answered 503.",
                        (f"time() - gpuscale_refresh_timestamp_seconds{{{sel}}}", "{{pod}}"),
                        unit="s",
                    ),
                    ts(
                        "Source freshness",
                        "How old each target's newest data is.",
                        (f"gpuscale_source_freshness_seconds{{{sel}}}", "{{source}} {{target}}"),
                        unit="s",
                    ),
                    ts(
                        "Source errors",
                        "Failed reads per second, per source and target.",
                        (f"rate(gpuscale_source_errors_total{{{sel}}}[5m])", "{{source}} {{target}}"),
                    ),
                    ts(
                        "Serving latency (p99)",
                        "How long the adapter takes to answer the metrics APIs, per API group.",
                        (
                            "histogram_quantile(0.99, sum by (le, group) "
                            f"(rate(gpuscale_adapter_request_duration_seconds_bucket{{{sel}}}[5m])))",
                            "{{group}}",
                        ),
                        unit="s",
                    ),
                    ts(
                        "Requests by code",
                        "Metrics API requests per second by HTTP code: 404 is a metric nobody serves, 503 stale data.",
                        (f"sum by (code) (rate(gpuscale_adapter_requests_total{{{sel}}}[5m]))", "{{code}}"),
                        unit="reqps",
                    ),
                    ts(
                        "Store",
                        "Devices and series folded in the last refresh.",
                        (f"sum(gpuscale_store_devices{{{sel}}})", "devices"),
                        (f"sum(gpuscale_store_series{{{sel}}})", "series"),
                    ),
                ],
            ),
            (
                "Controller",
                [
                    st(
                        "Breaker: nodes held back",
                        "Nodes with a problem the circuit breaker holds back now (0 is normal).",
                        f"sum(gpuscale_controller_held_back_nodes{{{sel}}})",
                    ),
                    st(
                        "Leader",
                        "Replicas acting as leader (1 is normal; 0 while the controller runs in dry-run, which takes no Lease).",
                        f"sum(gpuscale_controller_leader{{{sel}}})",
                    ),
                    st(
                        "Sources down",
                        "Controller sources whose last read failed.",
                        f"count(gpuscale_controller_source_up{{{sel}}} == 0) or vector(0)",
                    ),
                    st(
                        "Reconcile failures (range)",
                        "Reconciles or planners that failed in the time range.",
                        f"sum(increase(gpuscale_controller_reconcile_failures_total{{{sel}}}[$__range])) or vector(0)",
                    ),
                    ts(
                        "Reconcile duration (p99)",
                        "Wall time of one reconcile: telemetry refresh, plan, apply.",
                        (
                            "histogram_quantile(0.99, sum by (le) "
                            f"(rate(gpuscale_controller_reconcile_duration_seconds_bucket{{{sel}}}[5m])))",
                            "p99",
                        ),
                        unit="s",
                    ),
                    ts(
                        "Breaker hold-backs",
                        "Remediations the breaker held back per 5 minutes.",
                        (f"sum(increase(gpuscale_controller_held_back_total{{{sel}}}[5m]))", "held back"),
                    ),
                ],
            ),
        ],
    )


DASHBOARDS = {
    "fleet": fleet,
    "gpu-hardware": hardware,
    "gpu-health": health,
    "inference": inference,
    "training": training,
    "cost": cost,
    "gpuscale": gpuscale_self,
}


def render(build_fn: Callable) -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(build_fn()) + "\n"
