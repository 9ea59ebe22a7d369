"""Settings groups (gpuscale/settings.py, issue 33 item 3): a concept several commands share is declared once and
composed into each command; its flags are the group's prefix plus its field names; a command is built from the same
flat flag names as before, and the group is handed whole to what needs it.
"""

from __future__ import annotations

import argparse

import pytest

from gpuscale.adapter.auth_config import AuthenticationFlags as AuthFlagsOfTheAdapter
from gpuscale.cli.simulate import SimulateSettings
from gpuscale.cli.top import TopSettings
from gpuscale.controller.health import HealthActions as HealthActionsOfThePlanner
from gpuscale.controller.hints import HintActions as HintActionsOfThePlanner
from gpuscale.errors import ConfigError
from gpuscale.settings import (
    AdapterSettings,
    AuthenticationFlags,
    ControllerSettings,
    DemoSettings,
    ExporterScrape,
    HealthActions,
    HintActions,
    PrometheusConnection,
    add_arguments,
    from_arguments,
)


def _parsed(model, *argv: str):
    parser = argparse.ArgumentParser()
    add_arguments(parser, model)
    return from_arguments(model, parser.parse_args(list(argv)))


def test_the_command_line_fills_the_groups_and_each_is_handed_whole():
    settings = _parsed(
        ControllerSettings,
        *("--prometheus-url", "https://prom:9090", "--prometheus-ca-file", "/ca.pem"),
        *("--no-health-taint", "--health-drain", "--hint-safe-to-evict", "--log-level", "debug"),
    )
    assert settings.prometheus == PrometheusConnection(url="https://prom:9090", ca_file="/ca.pem")
    assert settings.health_actions == HealthActions(taint=False, drain=True)
    assert settings.hint_actions == HintActions(safe_to_evict=True)
    assert settings.logging.log_level == "debug"
    # NB: the planners take the settings group itself, not a copy of its fields
    assert HealthActionsOfThePlanner is HealthActions and HintActionsOfThePlanner is HintActions
    assert AuthFlagsOfTheAdapter is AuthenticationFlags


def test_flat_names_build_a_command_and_read_a_group_field():
    settings = AdapterSettings(
        prometheus_url="http://prom:9090",
        requestheader_allowed_names=["front-proxy"],
        kubeconfig="/kc",
        policies="/p",
        log_level="warning",
    )
    assert settings.authentication == AuthenticationFlags(requestheader_allowed_names=["front-proxy"])
    assert (settings.kube.kubeconfig, settings.files.policies, settings.files.config) == ("/kc", "/p", None)
    assert (settings.prometheus_url, settings.kubeconfig, settings.log_level) == ("http://prom:9090", "/kc", "warning")
    with pytest.raises(AttributeError):
        settings.prometheus_nothing  # noqa: B018


@pytest.mark.parametrize(
    ("model", "required", "level"),
    [
        (AdapterSettings, {"scrape_url": ["http://e:9400/metrics"]}, "info"),
        (DemoSettings, {}, "warning"),
        (TopSettings, {"view": "pods", "scrape_url": ["http://e:9400/metrics"]}, "error"),
        (SimulateSettings, {"hpa": ["h.yaml"], "trace": "t.csv"}, "warning"),
    ],
)
def test_a_command_keeps_its_own_default_in_a_shared_group(model, required, level, capsys):
    assert model(**required).logging.log_level == level
    parser = argparse.ArgumentParser()
    add_arguments(parser, model)
    parser.print_help()
    assert f"(default: {level})" in " ".join(capsys.readouterr().out.split())


def test_a_command_keeps_its_own_help_for_a_shared_field(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser, ControllerSettings)
    parser.print_help()
    shown = " ".join(capsys.readouterr().out.split())
    assert "read DCGM series from this Prometheus-compatible server" in shown
    assert "health.yaml, diagnosis.yaml, remediation.yaml override" in shown


def test_a_bad_group_value_names_its_flag():
    with pytest.raises(ConfigError, match=r"^--prometheus-url: 'prom:9090' is not an http"):
        _parsed(ControllerSettings, "--prometheus-url", "prom:9090")


@pytest.mark.parametrize(
    ("model", "required", "timeout"),
    [(AdapterSettings, {}, 3.0), (ControllerSettings, {}, 5.0), (TopSettings, {"view": "pods"}, 3.0)],
)
def test_the_exporter_flags_are_one_group_with_each_commands_own_timeout(model, required, timeout):
    settings = model(scrape_url=["http://e:9400/metrics"], **required)
    assert settings.scrape == ExporterScrape(scrape_url=["http://e:9400/metrics"], scrape_timeout=timeout)
    assert (settings.scrape_url, settings.scrape_timeout) == (["http://e:9400/metrics"], timeout)


def test_a_bad_exporter_flag_names_its_flag():
    with pytest.raises(ConfigError, match=r"^--scrape-timeout: "):
        _parsed(ControllerSettings, "--scrape-url", "http://e:9400/metrics", "--scrape-timeout", "-1")


def test_the_controller_scrapes_with_the_group_handed_whole():
    from gpuscale.cli.controller import _sources

    settings = _parsed(
        ControllerSettings,
        *("--scrape-url", "http://e:9400/metrics", "--scrape-timeout", "7s", "--max-body-bytes", "4096"),
    )
    [scrape], _, _ = _sources(settings)
    # NB: --max-body-bytes is new to the controller (it came with the group) and must reach the scrape
    assert (scrape.urls, scrape._timeout.total, scrape._max_body) == (["http://e:9400/metrics"], 7.0, 4096)


def test_top_discovers_with_its_dcgm_exporter_selector():
    import asyncio

    from gpuscale.cli.top import _discovered_through_the_api
    from gpuscale.errors import SourceUnavailable
    from gpuscale.sources.cluster_index import StaticClusterObjects

    class Proxy:
        host = "https://api:6443"

        async def refresh_token(self) -> None:
            return None

    flags = ExporterScrape(discover_exporters=True, dcgm_exporter_selector="team=gpu-exporter")
    rediscover = _discovered_through_the_api(StaticClusterObjects(), Proxy(), None, {}, flags)
    with pytest.raises(SourceUnavailable, match="labels team=gpu-exporter or"):
        asyncio.run(rediscover())
