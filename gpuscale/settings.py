"""Typed settings per command; the command-line flags are derived from them (krr's approach, on pydantic v2).

Each field's name becomes ``--field-name``; its description is the help text; list fields repeat
(``--scrape-url A --scrape-url B``); durations accept "5s", "1m30s" or seconds. Settings are passed as
arguments to whatever needs them — never through a global.
"""

from __future__ import annotations

import argparse
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuscale.config import Seconds
from gpuscale.errors import ConfigError


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AdapterSettings(_Settings):
    scrape_url: list[str] = Field(
        default_factory=list,
        description="exporter /metrics URL to scrape (repeatable); 'NAMESPACE/POD=URL' names the pod that serves it, "
        "otherwise the pod is found by IP and port through the Kubernetes API",
    )
    kubeconfig: str | None = Field(None, description="kubeconfig for pod labels (default: in-cluster config if any)")
    bind_address: str = Field("127.0.0.1", description="address to listen on")
    insecure_port: int = Field(6443, ge=0, le=65535, description="plain-HTTP port (local use; 0 = pick a free port)")
    config: str | None = Field(None, description="metric catalogue YAML (default: policies/metrics.yaml)")
    refresh_interval: Seconds = Field(5.0, gt=0, description="how often to scrape and refresh the store")
    scrape_timeout: Seconds = Field(3.0, gt=0, description="per-exporter scrape timeout")
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, description="largest exporter response accepted")
    log_level: str = Field("info", description="debug, info, warning or error")


class DemoSettings(_Settings):
    port: int = Field(8443, ge=0, le=65535, description="adapter port on 127.0.0.1 (0 = pick a free port)")
    duration: Seconds | None = Field(None, description="stop after this long (default: run until Ctrl-C)")
    refresh_interval: Seconds = Field(2.0, gt=0, description="adapter refresh interval")
    log_level: str = Field("warning", description="debug, info, warning or error")


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        origin = get_origin(field.annotation)
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        shown = f" (default: {default})" if default not in (None, [], "") else ""
        if origin is list:
            parser.add_argument(flag, dest=name, action="append", default=None, help=(field.description or "") + shown)
        else:
            parser.add_argument(flag, dest=name, default=None, help=(field.description or "") + shown)


def from_arguments(model: type[_Settings], args: argparse.Namespace) -> Any:
    values = {k: v for k, v in vars(args).items() if k in model.model_fields and v is not None}
    try:
        return model.model_validate(values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            flag = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "arguments"
            problems.append(f"{flag}: {err['msg'].removeprefix('Value error, ')}")
        raise ConfigError("; ".join(problems)) from None


__all__ = ["AdapterSettings", "DemoSettings", "Seconds", "add_arguments", "from_arguments", "get_args"]
