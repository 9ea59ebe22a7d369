"""Typed settings per command; the command-line flags are derived from them (krr's approach, on pydantic v2).

Each field's name becomes ``--field-name``; its description is the help text; list fields repeat
(``--scrape-url A --scrape-url B``); durations accept "5s", "1m30s" or seconds. Settings are passed as
arguments to whatever needs them — never through a global.

A concept several commands share (the Prometheus connection, the exporters scraped, Kubernetes access, logging,
policy files; the controller's health and hint actions and the adapter's authentication flags) is one
``SettingsGroup``, declared once and composed into each command's settings as a field (``group(...)``, which may
give the command its own defaults or help text); its fields' flags are the group's ``flag_prefix`` plus the field name
(``PrometheusConnection.token_file`` is ``--prometheus-token-file`` in every command). A command is built from the
flat flag names (``AdapterSettings(prometheus_url=…)``, or the parsed command line), and the group is handed whole
to what needs it (``settings.prometheus``); a group's field also reads by its flag name (``settings.log_level``).

A flag a command published under another name before its field moved into a group keeps working under that name
(``group(..., old_flags={"timeout": "--timeout"})``): the old name warns once on stderr, naming the new flag, and
giving both is an error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any, ClassVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from gpuscale.config import HttpUrl, Seconds, is_duration
from gpuscale.errors import ConfigError
from gpuscale.metrics.forecast import MODELS
from gpuscale.model import format_duration


class SettingsGroup(BaseModel):
    """Settings several commands share, composed into each as one field (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    flag_prefix: ClassVar[str] = ""
    """What a field's flag starts with: ``prometheus_`` makes ``url`` the flag ``--prometheus-url``."""


class PrometheusConnection(SettingsGroup):
    """Where a Prometheus-compatible server is and how to reach it: one room for every command that reads one
    (sources/promapi.py builds the client from it). Files are read again whenever they change."""

    flag_prefix: ClassVar[str] = "prometheus_"

    url: HttpUrl | None = Field(None, description="read from this Prometheus-compatible server")
    token_file: str | None = Field(None, description="bearer token file for --prometheus-url")
    ca_file: str | None = Field(None, description="CA bundle to verify --prometheus-url")
    client_cert: str | None = Field(None, description="client certificate for --prometheus-url")
    client_key: str | None = Field(None, description="client key for --prometheus-url")
    insecure_skip_verify: bool = Field(False, description="do not verify the Prometheus TLS certificate")
    # NB: a command reading on a cycle bounds it by its cycle too (PrometheusClient.connect's ``within``)
    timeout: Seconds = Field(10.0, gt=0, description="deadline of one Prometheus query, its answer's body included")
    # NB: a key without its certificate is refused by the client (promapi.py), after the files themselves are checked


class KubeAccess(SettingsGroup):
    """How a command reaches the Kubernetes API."""

    kubeconfig: str | None = Field(None, description="kubeconfig (default: the in-cluster service account)")


class ExporterScrape(SettingsGroup):
    """Which exporters a command scrapes itself (sources/scrape.py builds the scrape source from it) and its limits:
    the adapter, the controller and ``top`` read the same exporters the same way."""

    scrape_url: list[str] = Field(default_factory=list, description="exporter /metrics URL to scrape (repeatable)")
    discover_exporters: bool = Field(False, description="scrape the exporter pods found through the Kubernetes API")
    dcgm_exporter_selector: str = Field("app=nvidia-dcgm-exporter", description="label selector of dcgm-exporter pods")
    scrape_timeout: Seconds = Field(3.0, gt=0, description="timeout of one exporter scrape")
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, description="largest exporter response accepted")


class Logging(SettingsGroup):
    """What a command logs (to stderr)."""

    log_level: str = Field("info", description="debug, info, warning or error")


class PolicyFiles(SettingsGroup):
    """Where a command's policy files come from (gpuscale/policies/ ships them)."""

    policies: str | None = Field(
        None, description="directory whose metrics.yaml, diagnosis.yaml, health.yaml override the shipped ones"
    )


class CatalogueFiles(PolicyFiles):
    """The policy files and the metric catalogue, for the commands that read metrics through it."""

    config: str | None = Field(
        None, description="metric catalogue YAML (default: metrics.yaml of --policies, else shipped)"
    )


class HealthActions(SettingsGroup):
    """Which steps of GPU health remediation the controller may take (``--no-health-taint`` …)."""

    flag_prefix: ClassVar[str] = "health_"

    events: bool = Field(True, description="health: Events on the node")
    condition: bool = Field(True, description="health: the GpuHealthy node condition")
    taint: bool = Field(True, description="health: the cluster-autoscaler status taint")
    cordon: bool = Field(True, description="health: cordon")
    drain: bool = Field(False, description="health: drain cordoned nodes through the Eviction API")


class HintActions(SettingsGroup):
    """Which autoscaler hints the controller may give."""

    flag_prefix: ClassVar[str] = "hint_"

    scale_down_disabled: bool = Field(
        True, description="hints: scale-down-disabled on nodes with active multi-GPU gangs or warm inference"
    )
    karpenter: bool = Field(True, description="hints: karpenter.sh/do-not-disrupt on Karpenter nodes instead")
    idle: bool = Field(True, description="hints: Events and a gauge for requested-but-idle GPUs")
    safe_to_evict: bool = Field(
        False, description="hints: annotate idle GPU pods cluster-autoscaler.kubernetes.io/safe-to-evict=true"
    )


class AuthenticationFlags(SettingsGroup):
    """The ``--client-ca-file`` and ``--requestheader-*`` flags of the adapter's HTTPS port (adapter/auth_config.py).
    A part left unset comes from the cluster's extension-apiserver-authentication ConfigMap.

    Empty header lists mean the defaults (X-Remote-User, X-Remote-Group, X-Remote-Extra-; no uid header).
    """

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


def group(factory: type[SettingsGroup] | Any, *, old_flags: dict[str, str] | None = None, **help_text: str) -> Any:
    """A group field of a command: ``factory`` makes its default (a group class, or a function giving the command's
    own defaults); ``help_text`` replaces a field's help where this command reads it its own way; ``old_flags``
    names the flag a group field had in this command before it moved into the group (field name → ``--old-flag``),
    kept working as a deprecated alias (module docstring)."""
    extra = {"help": help_text, "old_flags": old_flags or {}}
    return Field(default_factory=factory, json_schema_extra=extra if help_text or old_flags else None)


def _group_extra(info: FieldInfo, key: str) -> dict[str, str]:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return extra.get(key) or {}  # type: ignore[return-value]


def old_flags(model: type[BaseModel]) -> dict[str, str]:
    """The deprecated flag names ``model`` still accepts: ``--old-flag`` → the dest of the flag that replaced it."""
    renamed = {}
    for info in model.model_fields.values():
        kind = _group_type(info)
        for field_name, old in _group_extra(info, "old_flags").items():
            renamed[old] = kind.flag_prefix + field_name  # type: ignore[union-attr]
    return renamed


def _group_type(info: FieldInfo) -> type[SettingsGroup] | None:
    kind = info.annotation
    return kind if isinstance(kind, type) and issubclass(kind, SettingsGroup) else None


class CommandSettings(BaseModel):
    """A command's settings: its own fields and its groups, built from flat flag names (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _into_groups(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        values = dict(values)
        for name, info in cls.model_fields.items():
            kind = _group_type(info)
            if kind is None or name in values:
                continue
            given = {f: values.pop(kind.flag_prefix + f) for f in kind.model_fields if kind.flag_prefix + f in values}
            if given:
                default = info.get_default(call_default_factory=True)
                values[name] = {**default.model_dump(exclude_unset=True), **given}
        return values

    def given(self) -> set[str]:
        """The flat names of the fields set rather than defaulted; a group field counts as set where the command's
        own group default (``group(lambda: …)``) sets it."""
        names = set(self.model_fields_set)
        for group_name, info in type(self).model_fields.items():
            if (kind := _group_type(info)) is not None:
                names |= {kind.flag_prefix + f for f in getattr(self, group_name).model_fields_set}
        return names

    def __getattr__(self, name: str) -> Any:
        # NB: a group's field read by its flag's name (settings.log_level for settings.logging.log_level), as
        # the commands' code read their flat settings before groups; only reached when normal lookup fails.
        for group_name, info in type(self).model_fields.items():
            kind = _group_type(info)
            if kind is None or not name.startswith(kind.flag_prefix):
                continue
            if (field := name.removeprefix(kind.flag_prefix)) in kind.model_fields:
                return getattr(getattr(self, group_name), field)
        return super().__getattr__(name)  # type: ignore[misc]


class AdapterSettings(CommandSettings):
    # --- where metrics come from ---
    scrape: ExporterScrape = group(
        ExporterScrape,
        scrape_url="exporter /metrics URL to scrape (repeatable); 'NAMESPACE/POD=URL' names the pod that serves it, "
        "otherwise the pod is found by IP and port through the Kubernetes API",
        discover_exporters="scrape the dcgm-exporter and Triton pods found through the Kubernetes API",
        scrape_timeout="per-exporter scrape timeout (at most --refresh-interval)",
    )
    triton_selector: str = Field(
        "gpuscale.io/scrape=triton",
        description="label selector of inference pods to scrape (pods annotated gpuscale.io/scrape=true are too)",
    )
    prometheus: PrometheusConnection = group(
        PrometheusConnection,
        url="read from this Prometheus-compatible server instead",
        # NB: the forecasts' history query (cli/forecast_history.py) has it too, uncut: it runs once per namespace
        timeout="deadline of a refresh's Prometheus queries, bodies included (at most --refresh-interval)",
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
    kube: KubeAccess = group(KubeAccess, kubeconfig="kubeconfig for pod labels (default: in-cluster config if any)")
    files: CatalogueFiles = group(CatalogueFiles)
    refresh_interval: Seconds = Field(5.0, gt=0, description="how often to scrape and refresh the store")
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
    authentication: AuthenticationFlags = group(AuthenticationFlags)
    allow_anonymous: bool = Field(
        False,
        description="serve unauthenticated requests as system:anonymous (still authorized by SubjectAccessReview)",
    )
    authn_cache_ttl: Seconds = Field(10.0, ge=0, description="how long TokenReview answers are cached")
    authz_cache_ttl: Seconds = Field(10.0, ge=0, description="how long SubjectAccessReview answers are cached")
    logging: Logging = group(Logging)
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
        if self.prometheus.url and (self.scrape_url or self.discover_exporters):
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


class DemoSettings(CommandSettings):
    port: int = Field(8443, ge=0, le=65535, description="adapter port on 127.0.0.1 (0 = pick a free port)")
    duration: Seconds = Field(
        300.0,
        gt=0,
        description="how long one pass of the autoscaling replay takes (the 30-minute trace slice is sped up to fit; "
        "it plays again and again until Ctrl-C)",
    )
    refresh_interval: Seconds = Field(1.0, gt=0, description="adapter refresh interval")
    files: CatalogueFiles = group(CatalogueFiles)
    keep_running: bool = Field(
        True,
        description="keep the simulated cluster, the adapter and the HPA loop running until Ctrl-C, the trace slice "
        "replayed again and again, so the printed commands keep working (--no-keep-running: one pass, then exit)",
    )
    logging: Logging = group(lambda: Logging(log_level="warning"))


class ControllerSettings(CommandSettings):
    # --- where it reads from ---
    kube: KubeAccess = group(KubeAccess)
    scrape: ExporterScrape = group(
        lambda: ExporterScrape(scrape_timeout=5.0),
        scrape_url="dcgm-exporter /metrics URL to scrape (repeatable; the node from its labels)",
        discover_exporters="scrape the dcgm-exporter pods found through the Kubernetes API (their node: the pod's)",
        scrape_timeout="timeout of one exporter scrape",
    )
    # NB: its timeout is not the scrape timeout: one read asks for every GPU's ~20 series at once, which at 8,000
    # GPUs took a busy 2-core Prometheus far longer than one exporter scrape (docs/benchmarks.md, the fleet on the
    # real API)
    prometheus: PrometheusConnection = group(
        PrometheusConnection,
        url="read DCGM series from this Prometheus-compatible server",
        timeout="deadline of a reconcile's Prometheus queries, bodies included (at most --interval)",
    )
    files: PolicyFiles = group(
        PolicyFiles,
        policies="directory whose health.yaml, diagnosis.yaml, remediation.yaml override the shipped ones",
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
    logging: Logging = group(Logging)
    # --- health remediation (each step switchable) ---
    health: bool = Field(True, description="GPU health remediation")
    health_actions: HealthActions = group(HealthActions)
    # --- autoscaler hints ---
    hints: bool = Field(True, description="autoscaler hints from telemetry")
    hint_actions: HintActions = group(HintActions)
    # --- gang-aware capacity (policies/pools.yaml; each also needs its `enabled` there) ---
    gangs: bool = Field(True, description="ProvisioningRequests for pending gangs, NVLink-domain warnings")
    expander: bool = Field(True, description="the cluster-autoscaler priority-expander ConfigMap from pool ranking")
    karpenter_nodepool: list[str] = Field(
        default_factory=list,
        description="a Karpenter NodePool whose spec.weight the controller sets from the same pool ranking "
        "(repeatable; no NodePool is written unless named here)",
    )

    @model_validator(mode="after")
    def _check(self) -> ControllerSettings:
        if self.prometheus.url and (self.scrape_url or self.discover_exporters):
            raise ValueError("prometheus-url: give either --prometheus-url or scrape targets, not both")
        if not self.prometheus.url and not self.scrape_url and not self.discover_exporters:
            raise ValueError("scrape-url: give --scrape-url (repeatable), --discover-exporters or --prometheus-url")
        if self.karpenter_nodepool and not self.expander:
            raise ValueError("karpenter-nodepool: NodePool weights are the expander's ranking; drop --no-expander")
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("renew-deadline: needs --retry-period < --renew-deadline < --lease-duration")
        return self


def flag_fields(model: type[BaseModel]) -> Iterator[tuple[str, FieldInfo, Any, str]]:
    """Each flag of ``model``: (its dest, the field, its default, its help), groups' fields in their place."""
    for name, info in model.model_fields.items():
        kind = _group_type(info)
        if kind is None:
            default = None if info.is_required() else info.get_default(call_default_factory=True)
            yield name, info, default, info.description or ""
            continue
        defaults = info.get_default(call_default_factory=True)
        help_text = _group_extra(info, "help")
        for field_name, field in kind.model_fields.items():
            described = help_text.get(field_name, field.description or "")
            yield kind.flag_prefix + field_name, field, getattr(defaults, field_name), described


# NB: where add_arguments leaves the command's name (``gpuscale report``) for from_arguments' warnings
_COMMAND_DEST = "settings_command"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _old_dest(old: str) -> str:
    return "old_flag_" + old.removeprefix("--").replace("-", "_")


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    for name, field, default, described in flag_fields(model):
        flag = _flag(name)
        origin = get_origin(field.annotation)
        if default not in (None, [], "") and is_duration(field):
            default = format_duration(default)
        shown = f" (default: {default})" if default not in (None, [], "") else ""
        if field.annotation is bool and name.startswith("no_") and default is False:
            # NB: BooleanOptionalAction would also offer --no-no-progress
            parser.add_argument(flag, dest=name, action="store_true", default=None, help=described)
        elif field.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=described)
        elif origin is list:
            parser.add_argument(flag, dest=name, action="append", default=None, help=described + shown)
        else:
            parser.add_argument(flag, dest=name, default=None, help=described + shown)
    for old, name in old_flags(model).items():
        described = f"deprecated: the old name of {_flag(name)}"
        parser.add_argument(old, dest=_old_dest(old), metavar=name.upper(), default=None, help=described)
    if old_flags(model):
        parser.set_defaults(**{_COMMAND_DEST: parser.prog})  # NB: the deprecation warning names the command


def _renamed_values(model: type[BaseModel], args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The values given under an old flag name, by the new flag's dest, and which old name each was given as (new
    flag → old); ConfigError when a flag is given under both names."""
    values, typed = {}, {}
    for old, name in old_flags(model).items():
        value = getattr(args, _old_dest(old), None)
        if value is None:
            continue
        if getattr(args, name, None) is not None:
            raise ConfigError(f"{old}: give {_flag(name)} or its deprecated name {old}, not both")
        values[name], typed[_flag(name)] = value, old
    return values, typed


def _argument(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """How the user wrote a field: its flag, or a positional's metavar (``VIEW``, not ``--view``)."""
    field = model.model_fields.get(str(loc[0]))
    kind = _group_type(field) if field is not None else None
    if kind is not None and len(loc) > 1:
        return "--" + (kind.flag_prefix + str(loc[1])).replace("_", "-")
    extra = field.json_schema_extra if field is not None and isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get("metavar") or "--" + str(loc[0]).replace("_", "-"))


def from_arguments(model: type[BaseModel], args: argparse.Namespace) -> Any:
    names = {name for name, *_ in flag_fields(model)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    renamed, typed = _renamed_values(model, args)
    values.update(renamed)
    try:
        settings = model.model_validate(values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            msg = err["msg"].removeprefix("Value error, ")
            field = model.model_fields.get(str(err["loc"][0])) if err["loc"] else None
            if err["loc"] and not (len(err["loc"]) == 1 and field is not None and _group_type(field)):
                flag = _argument(model, err["loc"])
                problems.append(f"{typed.get(flag, flag)}: {msg}")  # NB: the name the user typed
            else:  # a cross-field rule (of the command or of a group); its message starts with the flag it is about
                problems.append(f"--{msg}")
        raise ConfigError("; ".join(problems)) from None
    command = getattr(args, _COMMAND_DEST, None)
    for new_flag, old in typed.items():  # NB: after validation, so a bad value is one line, the error
        print(f"{command + ': ' if command else ''}{old} is deprecated; use {new_flag}", file=sys.stderr)
    return settings


__all__ = [
    "AdapterSettings",
    "AuthenticationFlags",
    "CatalogueFiles",
    "CommandSettings",
    "ControllerSettings",
    "DemoSettings",
    "ExporterScrape",
    "HealthActions",
    "HintActions",
    "KubeAccess",
    "Logging",
    "PolicyFiles",
    "PrometheusConnection",
    "Seconds",
    "SettingsGroup",
    "add_arguments",
    "flag_fields",
    "from_arguments",
    "get_args",
    "group",
    "old_flags",
]
