"""Typed settings per command; the command-line flags are derived from them (krr's approach, on pydantic v2).

Each field's name becomes ``--field-name``; its description is the help text; list fields repeat
(``--scrape-url A --scrape-url B``); durations accept "5s", "1m30s" or seconds. Settings are passed as
arguments to whatever needs them — never through a global.
"""

from __future__ import annotations

import argparse
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpuscale.config import HttpUrl, Seconds, is_duration
from gpuscale.errors import ConfigError
from gpuscale.metrics.forecast import MODELS
from gpuscale.model import format_duration


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AdapterSettings(_Settings):
    # --- where metrics come from ---
    scrape_url: list[str] = Field(
        default_factory=list,
        description="exporter /metrics URL to scrape (repeatable); 'NAMESPACE/POD=URL' names the pod that serves it, "
        "otherwise the pod is found by IP and port through the Kubernetes API",
    )
    discover_exporters: bool = Field(
        False, description="scrape the dcgm-exporter and Triton pods found through the Kubernetes API"
    )
    dcgm_exporter_selector: str = Field("app=nvidia-dcgm-exporter", description="label selector of dcgm-exporter pods")
    triton_selector: str = Field(
        "gpuscale.io/scrape=triton",
        description="label selector of inference pods to scrape (pods annotated gpuscale.io/scrape=true are too)",
    )
    prometheus_url: HttpUrl | None = Field(None, description="read from this Prometheus-compatible server instead")
    prometheus_token_file: str | None = Field(None, description="bearer token file for --prometheus-url")
    prometheus_ca_file: str | None = Field(None, description="CA bundle to verify --prometheus-url")
    prometheus_client_cert: str | None = Field(None, description="client certificate for --prometheus-url")
    prometheus_client_key: str | None = Field(None, description="client key for --prometheus-url")
    prometheus_insecure_skip_verify: bool = Field(False, description="do not verify the Prometheus TLS certificate")
    prometheus_timeout: Seconds = Field(
        10.0,
        gt=0,
        description="deadline of a refresh's Prometheus queries, bodies included (at most --refresh-interval)",
    )
    prometheus_max_response_size: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="bytes: a bigger answer to one Prometheus query is refused while it streams in (never decoded); "
        "that query's last values keep serving",
    )
    prometheus_max_label_sets: int = Field(
        50_000,
        ge=1,
        description="distinct label sets kept from Prometheus (~15,000 at 10,000 GPUs): series past it in one refresh "
        "are left out and counted (gpuscale_source_dropped_series), so series churn cannot grow memory without bound",
    )
    prometheus_decode_process: bool = Field(
        True,
        description="decode Prometheus answers in a child process, so that no decode holds up HPA requests "
        "(docs/adapter.md); --no-prometheus-decode-process decodes them in a thread of the adapter",
    )
    kubeconfig: str | None = Field(None, description="kubeconfig for pod labels (default: in-cluster config if any)")
    config: str | None = Field(
        None, description="metric catalogue YAML (default: metrics.yaml of --policies, else shipped)"
    )
    policies: str | None = Field(
        None, description="directory whose metrics.yaml, diagnosis.yaml, health.yaml override the shipped ones"
    )
    refresh_interval: Seconds = Field(5.0, gt=0, description="how often to scrape and refresh the store")
    scrape_timeout: Seconds = Field(3.0, gt=0, description="per-exporter scrape timeout (at most --refresh-interval)")
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, description="largest exporter response accepted")
    demand_driven: bool = Field(
        True,
        description="with --prometheus-url and the Kubernetes API: refresh at the full rate only the metrics and "
        "namespaces some HorizontalPodAutoscaler references, others from their first request on (docs/adapter.md)",
    )
    keep_warm: Seconds = Field(
        600.0, ge=0, description="how long a metric no HPA references keeps being refreshed after its last request"
    )
    # --- what is served, where ---
    apis: str = Field("custom,external", description="metrics APIs to serve: custom, external or custom,external")
    bind_address: str = Field("0.0.0.0", description="address the HTTPS port listens on")
    insecure_bind_address: str = Field(
        "127.0.0.1", description="address the plain-HTTP --insecure-port listens on (no authentication: loopback)"
    )
    secure_port: int | None = Field(
        None, ge=0, le=65535, description="HTTPS port (default 6443 unless --insecure-port alone is given)"
    )
    insecure_port: int | None = Field(
        None, ge=0, le=65535, description="plain-HTTP port for local use, without authentication (0 = any free port)"
    )
    tls_cert_file: str | None = Field(
        None, description="serving certificate (PEM); self-signed into --cert-dir if unset"
    )
    tls_private_key_file: str | None = Field(None, description="serving private key (PEM)")
    cert_dir: str = Field("apiserver.local.config/certificates", description="where a self-signed certificate is kept")
    tls_reload_interval: Seconds = Field(
        10.0, ge=0, description="how often the serving certificate files are checked for a renewal (0: never)"
    )
    client_ca_file: str | None = Field(None, description="CA for client certificates (default: from the cluster)")
    requestheader_client_ca_file: str | None = Field(
        None, description="CA of the front proxy (default: kube-system/extension-apiserver-authentication)"
    )
    requestheader_allowed_names: list[str] = Field(
        default_factory=list, description="front-proxy client certificate CNs allowed (repeatable; empty = any)"
    )
    requestheader_username_headers: list[str] = Field(default_factory=list, description="default X-Remote-User")
    requestheader_group_headers: list[str] = Field(default_factory=list, description="default X-Remote-Group")
    requestheader_extra_headers_prefix: list[str] = Field(default_factory=list, description="default X-Remote-Extra-")
    requestheader_uid_headers: list[str] = Field(default_factory=list, description="headers carrying the user's UID")
    allow_anonymous: bool = Field(
        False,
        description="serve unauthenticated requests as system:anonymous (still authorized by SubjectAccessReview)",
    )
    authn_cache_ttl: Seconds = Field(10.0, ge=0, description="how long TokenReview answers are cached")
    authz_cache_ttl: Seconds = Field(10.0, ge=0, description="how long SubjectAccessReview answers are cached")
    log_level: str = Field("info", description="debug, info, warning or error")
    # --- forecasts (docs/forecast.md) ---
    forecast: bool = Field(
        True, description="serve forecast_* metrics per Deployment/StatefulSet (needs the Kubernetes API)"
    )
    forecast_model: str = Field("holt", description="forecast model: naive, seasonal_naive, ses, holt, seasonal_holt")
    forecast_rate_metric: str = Field(
        "inference_requests_per_second", description="catalogue metric summed over a workload's pods as its demand"
    )
    forecast_default_startup: Seconds = Field(
        180.0, gt=0, description="forecast horizon of a workload with no startup annotation and no ready pod measured"
    )
    forecast_min_history: Seconds = Field(
        600.0, gt=0, description="request-rate history a workload needs before its forecast is served"
    )

    @property
    def serve_custom(self) -> bool:
        return "custom" in self._apis

    @property
    def serve_external(self) -> bool:
        return "external" in self._apis

    @property
    def _apis(self) -> set[str]:
        return {a.strip() for a in self.apis.split(",") if a.strip()}

    @model_validator(mode="after")
    def _check(self) -> AdapterSettings:
        unknown = self._apis - {"custom", "external"}
        if unknown or not self._apis:
            raise ValueError(f"apis: expected custom, external or custom,external, got {self.apis!r}")
        if self.prometheus_url and (self.scrape_url or self.discover_exporters):
            raise ValueError("prometheus-url: give either --prometheus-url or scrape targets, not both")
        if bool(self.tls_cert_file) != bool(self.tls_private_key_file):
            raise ValueError("tls-cert-file: give both --tls-cert-file and --tls-private-key-file")
        if self.forecast_model not in MODELS:
            raise ValueError(f"forecast-model: unknown model {self.forecast_model!r}; valid: {', '.join(MODELS)}")
        return self

    @property
    def https_port(self) -> int | None:
        if self.secure_port is not None:
            return self.secure_port
        return None if self.insecure_port is not None else 6443


class DemoSettings(_Settings):
    port: int = Field(8443, ge=0, le=65535, description="adapter port on 127.0.0.1 (0 = pick a free port)")
    duration: Seconds = Field(
        300.0,
        gt=0,
        description="how long one pass of the autoscaling replay takes (the 30-minute trace slice is sped up to fit; "
        "it plays again and again until Ctrl-C)",
    )
    refresh_interval: Seconds = Field(1.0, gt=0, description="adapter refresh interval")
    config: str | None = Field(
        None, description="metric catalogue YAML (default: metrics.yaml of --policies, else shipped)"
    )
    policies: str | None = Field(
        None, description="directory whose metrics.yaml, diagnosis.yaml, health.yaml override the shipped ones"
    )
    keep_running: bool = Field(
        True,
        description="keep the simulated cluster, the adapter and the HPA loop running until Ctrl-C, the trace slice "
        "replayed again and again, so the printed commands keep working (--no-keep-running: one pass, then exit)",
    )
    log_level: str = Field("warning", description="debug, info, warning or error")


class ControllerSettings(_Settings):
    # --- where it reads from ---
    kubeconfig: str | None = Field(None, description="kubeconfig (default: the in-cluster service account)")
    scrape_url: list[str] = Field(
        default_factory=list, description="dcgm-exporter /metrics URL to scrape (repeatable; the node from its labels)"
    )
    discover_exporters: bool = Field(
        False, description="scrape the dcgm-exporter pods found through the Kubernetes API (their node: the pod's)"
    )
    dcgm_exporter_selector: str = Field("app=nvidia-dcgm-exporter", description="label selector of dcgm-exporter pods")
    prometheus_url: HttpUrl | None = Field(None, description="read DCGM series from this Prometheus-compatible server")
    prometheus_token_file: str | None = Field(None, description="bearer token file for --prometheus-url")
    scrape_timeout: Seconds = Field(5.0, gt=0, description="timeout of one exporter scrape or Prometheus query")
    policies: str | None = Field(
        None, description="directory whose health.yaml, diagnosis.yaml, remediation.yaml override the shipped ones"
    )
    # --- how it runs ---
    namespace: str = Field("gpuscale", description="namespace of the Lease and of the breaker's state ConfigMap")
    identity: str | None = Field(None, description="this replica's name in the Lease (default: $POD_NAME or host)")
    interval: Seconds = Field(15.0, gt=0, description="time between reconciles")
    leader_elect: bool = Field(True, description="elect one acting replica through a coordination.k8s.io Lease")
    lease_name: str = Field("gpuscale-controller", description="name of the Lease")
    lease_duration: Seconds = Field(15.0, gt=0, description="how long a Lease lasts unrenewed")
    renew_deadline: Seconds = Field(10.0, gt=0, description="a leader that cannot renew for this long stops acting")
    retry_period: Seconds = Field(2.0, gt=0, description="time between Lease renewals")
    dry_run: bool = Field(False, description="validate every write on the server (dryRun=All) and change nothing")
    port: int = Field(8080, ge=0, le=65535, description="port of /healthz, /readyz and /metrics (0 = any free port)")
    bind_address: str = Field("0.0.0.0", description="address that port listens on")
    log_level: str = Field("info", description="debug, info, warning or error")
    # --- health remediation (each step switchable) ---
    health: bool = Field(True, description="GPU health remediation")
    health_events: bool = Field(True, description="health: Events on the node")
    health_condition: bool = Field(True, description="health: the GpuHealthy node condition")
    health_taint: bool = Field(True, description="health: the cluster-autoscaler status taint")
    health_cordon: bool = Field(True, description="health: cordon")
    health_drain: bool = Field(False, description="health: drain cordoned nodes through the Eviction API")
    # --- autoscaler hints ---
    hints: bool = Field(True, description="autoscaler hints from telemetry")
    hint_scale_down_disabled: bool = Field(
        True, description="hints: scale-down-disabled on nodes with active multi-GPU gangs or warm inference"
    )
    hint_karpenter: bool = Field(True, description="hints: karpenter.sh/do-not-disrupt on Karpenter nodes instead")
    hint_idle: bool = Field(True, description="hints: Events and a gauge for requested-but-idle GPUs")
    hint_safe_to_evict: bool = Field(
        False, description="hints: annotate idle GPU pods cluster-autoscaler.kubernetes.io/safe-to-evict=true"
    )
    # --- gang-aware capacity (policies/pools.yaml; each also needs its `enabled` there) ---
    gangs: bool = Field(True, description="ProvisioningRequests for pending gangs, NVLink-domain warnings")
    expander: bool = Field(True, description="the cluster-autoscaler priority-expander ConfigMap from pool ranking")

    @model_validator(mode="after")
    def _check(self) -> ControllerSettings:
        if self.prometheus_url and (self.scrape_url or self.discover_exporters):
            raise ValueError("prometheus-url: give either --prometheus-url or scrape targets, not both")
        if not self.prometheus_url and not self.scrape_url and not self.discover_exporters:
            raise ValueError("scrape-url: give --scrape-url (repeatable), --discover-exporters or --prometheus-url")
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("renew-deadline: needs --retry-period < --renew-deadline < --lease-duration")
        return self


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        origin = get_origin(field.annotation)
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        if default not in (None, [], "") and is_duration(field):
            default = format_duration(default)
        shown = f" (default: {default})" if default not in (None, [], "") else ""
        if field.annotation is bool and name.startswith("no_") and default is False:
            # NB: BooleanOptionalAction would also offer --no-no-progress
            parser.add_argument(flag, dest=name, action="store_true", default=None, help=field.description or "")
        elif field.annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=field.description or ""
            )
        elif origin is list:
            parser.add_argument(flag, dest=name, action="append", default=None, help=(field.description or "") + shown)
        else:
            parser.add_argument(flag, dest=name, default=None, help=(field.description or "") + shown)


def _argument(model: type[BaseModel], name: str) -> str:
    """How the user wrote a field: its flag, or a positional's metavar (``VIEW``, not ``--view``)."""
    field = model.model_fields.get(name)
    extra = field.json_schema_extra if field is not None and isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get("metavar") or "--" + name.replace("_", "-"))


def from_arguments(model: type[_Settings], args: argparse.Namespace) -> Any:
    values = {k: v for k, v in vars(args).items() if k in model.model_fields and v is not None}
    try:
        return model.model_validate(values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            msg = err["msg"].removeprefix("Value error, ")
            if err["loc"]:
                problems.append(f"{_argument(model, str(err['loc'][0]))}: {msg}")
            else:  # a cross-field rule; its message starts with the flag it is about
                problems.append(f"--{msg}")
        raise ConfigError("; ".join(problems)) from None


__all__ = [
    "AdapterSettings",
    "ControllerSettings",
    "DemoSettings",
    "Seconds",
    "add_arguments",
    "from_arguments",
    "get_args",
]
