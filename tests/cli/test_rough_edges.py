"""What a new user hits first: help text, usage errors, a port in use, a given config file, /readyz wording."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
import yaml

from gpuscale.cli.adapter import readiness
from gpuscale.cli.main import main
from gpuscale.errors import ConfigError
from gpuscale.metrics.catalogue import UNITS, load_catalogue
from gpuscale.metrics.diagnosis import load_policy
from gpuscale.policy_files import POLICY_FILES, check_policies_dir, policy_file, shipped
from gpuscale.sources.base import TargetHealth


def _words(text: str) -> str:
    return " ".join(text.split())  # argparse wraps help lines


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["adapter"], "how often to scrape and refresh the store (default: 5s)"),
        (
            ["adapter"],
            "deadline of a refresh's Prometheus queries, bodies included (at most --refresh-interval) (default: 10s)",
        ),
        (["demo"], "adapter refresh interval (default: 1s)"),
        (["top"], "time between refreshes with --watch (default: 2s)"),
    ],
)
def test_help_shows_durations_as_they_are_written(capsys, monkeypatch, args, shown):
    monkeypatch.setenv("COLUMNS", "400")  # NB: argparse wraps help at hyphens otherwise
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--help"])
    assert exit_.value.code == 0
    out = _words(capsys.readouterr().out)
    assert shown in out
    assert "(default: 5.0)" not in out and "(default: 2.0)" not in out


@pytest.mark.parametrize(("command", "args"), [("adapter", []), ("demo", []), ("top", ["pods"])])
def test_a_mistyped_flag_prints_that_subcommands_usage(capsys, command, args):
    with pytest.raises(SystemExit) as exit_:
        main([command, *args, "--refesh-interval"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: gpuscale {command} ")
    assert err.strip().endswith(f"gpuscale {command}: error: unrecognized arguments: --refesh-interval")


def test_kubectl_gpu_help_says_kubectl_gpu(capsys):
    with pytest.raises(SystemExit):
        main(["top", "--help"], prog="kubectl gpu")
    assert capsys.readouterr().out.startswith("usage: kubectl gpu top ")


def test_a_port_in_use_is_one_line_naming_the_flag(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = ["--insecure-port", str(port), "--log-level", "error"]  # NB: loopback without --bind-address
        code = main(["adapter", *flags, "--scrape-url", "http://127.0.0.1:9/metrics"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuscale adapter: --insecure-port: cannot listen on 127.0.0.1:{port}: ")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_top_never_ignores_a_given_config(capsys, tmp_path):
    bad = tmp_path / "metrics.yaml"
    bad.write_text(
        "metrics:\n  - name: gpu_x\n    unit: precent\n    aggregate: mean\n    series: [DCGM_FI_DEV_GPU_UTIL]\n"
    )
    # NB: with --adapter-url the catalogue is not read to collect: it must still be validated.
    code = main(["top", "pods", "--adapter-url", "http://127.0.0.1:9", "--config", str(bad)])
    assert code == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "metrics[0] (gpu_x).unit: unknown unit 'precent'" in err, err


def test_catalogue_units_are_checked_and_the_shipped_ones_are_known():
    shipped_units = {m.unit for m in load_catalogue().metrics}
    assert shipped_units and shipped_units <= set(UNITS)


def test_a_policies_directory_overrides_only_the_files_it_holds(tmp_path):
    diagnosis = yaml.safe_load(shipped("diagnosis.yaml").read_text(encoding="utf-8"))
    diagnosis["sm_active"]["effective"] = 0.92
    (tmp_path / "diagnosis.yaml").write_text(yaml.safe_dump(diagnosis))
    assert policy_file("diagnosis.yaml", tmp_path) == tmp_path / "diagnosis.yaml"
    assert policy_file("health.yaml", tmp_path) == shipped("health.yaml")
    policy = load_policy(tmp_path)
    assert policy.diagnosis.sm_active.effective == 0.92
    assert policy.health == load_policy().health
    assert check_policies_dir(tmp_path) == tmp_path


def test_a_policies_directory_that_holds_nothing_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="holds none of " + ", ".join(POLICY_FILES)):
        check_policies_dir(tmp_path)
    with pytest.raises(ConfigError, match="not a directory"):
        check_policies_dir(tmp_path / "missing")


def test_the_shipped_policies_are_found_beside_the_imported_package():
    import gpuscale

    for name in POLICY_FILES:
        # NB: relative to wherever gpuscale was imported from (site-packages for a wheel), never a source tree
        # path computed from this file; tests/e2e/test_installed_wheel.py runs the installed wheel itself.
        assert Path(str(shipped(name))) == Path(gpuscale.__file__).parent / "policies" / name
        assert shipped(name).read_text(encoding="utf-8").strip()


def _health(last_success: float | None, error: str | None = "connection refused") -> TargetHealth:
    return TargetHealth(
        target="http://10.0.0.1:9400/metrics", healthy=error is None, last_success=last_success, error=error
    )


def test_readyz_says_how_long_nothing_answered_since_the_start():
    ok, message = readiness(
        store_ready=True, cluster_synced=True, health=[_health(None)], max_age=60.0, started=1000.0, now=1015.0
    )
    assert not ok
    assert (
        message == "no source has answered since the start 15s ago (http://10.0.0.1:9400/metrics: connection refused)"
    )


def test_readyz_says_how_long_since_the_last_answer_and_the_max_age():
    ok, message = readiness(
        store_ready=True, cluster_synced=None, health=[_health(1000.0)], max_age=60.0, started=900.0, now=1090.0
    )
    assert not ok
    assert message.startswith("no source has answered for 1m30s, longer than the max-age of 1m ")


def test_readyz_is_ready_while_one_source_is_fresh_and_says_what_fails():
    health = [_health(None), _health(1080.0, None)]
    ok, message = readiness(
        store_ready=True, cluster_synced=True, health=health, max_age=60.0, started=900.0, now=1090.0
    )
    assert ok
    assert message == "1 of 2 targets failing or degraded: http://10.0.0.1:9400/metrics: connection refused"
    assert readiness(
        store_ready=True, cluster_synced=True, health=health[1:], max_age=60.0, started=900.0, now=1090.0
    ) == (True, "")
    ok, message = readiness(
        store_ready=False, cluster_synced=True, health=health, max_age=60, started=1085.0, now=1090.0
    )
    assert not ok and message == "first refresh has not completed (5s since the start)"


def test_readyz_never_echoes_an_exporters_raw_bytes():
    raw = "line 3: bad value 'x\x1b[31m\x00" + "y" * 400 + "'"
    ok, message = readiness(
        store_ready=True, cluster_synced=True, health=[_health(None, raw)], max_age=60.0, started=0.0, now=10.0
    )
    assert not ok and message.isprintable() and len(message) < 260, message


async def test_the_unauthenticated_port_binds_loopback_and_the_log_says_what_was_bound(caplog):
    from gpuscale.cli.adapter import start_adapter
    from gpuscale.settings import AdapterSettings

    caplog.set_level(logging.WARNING)
    settings = AdapterSettings(
        scrape_url=["http://127.0.0.1:9/metrics"], insecure_port=0, scrape_timeout=30, refresh_interval=5
    )
    assert settings.bind_address == "0.0.0.0" and settings.insecure_bind_address == "127.0.0.1"
    adapter = await start_adapter(settings)
    try:
        (listening,) = adapter.listening
        assert listening.startswith("http://127.0.0.1:") and listening.endswith("(plain HTTP, no authentication)")
        assert adapter.url == listening.split(" ")[0]
    finally:
        await adapter.stop()
    # --scrape-timeout longer than the refresh is cut to it, and the log says so.
    assert any(
        "--scrape-timeout 30s is longer than --refresh-interval 5s: reads time out after 5s" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


# --- issue 25: the first hour's rough edges ---------------------------------------------------------------


def test_top_with_an_unknown_view_names_the_view_not_a_flag(capsys):
    assert main(["top", "foo", "--scrape-url", "http://127.0.0.1:1/metrics"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "gpuscale top: VIEW: 'foo' is not a view; valid: nodes, pods, gpus, workloads (also node, no, pod, po, gpu, wl)"
    )


@pytest.mark.parametrize("command", ["adapter", "demo", "top", "controller", "report", "simulate"])
def test_no_flag_is_offered_as_its_double_negative(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "--no-no-" not in out
    if command == "report":
        assert "--no-progress" in out


def test_report_no_progress_is_a_plain_switch():
    from gpuscale.cli.main import _parse
    from gpuscale.cli.report import ReportSettings
    from gpuscale.settings import from_arguments

    args = _parse(["report", "--from", "x.npz", "--no-progress"], "gpuscale")
    assert from_arguments(ReportSettings, args).no_progress is True
    assert from_arguments(ReportSettings, _parse(["report", "--from", "x.npz"], "gpuscale")).no_progress is False


@pytest.mark.parametrize("flag", ["--from-file", "--from"])
def test_report_from_a_missing_file_says_so(capsys, tmp_path, flag):
    missing = tmp_path / "week.npz"
    assert main(["report", flag, str(missing)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"gpuscale report: --from {missing}: no such file"


def test_report_from_a_directory_says_so(capsys, tmp_path):
    assert main(["report", "--from", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"gpuscale report: --from {tmp_path}: a directory"


NOW = 1_764_576_000.0  # 2025-12-01T08:00:00Z


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1764576000", NOW),
        ("1764576000.5", NOW + 0.5),
        ("2025-12-01T08:00:00Z", NOW),
        ("2025-12-01T08:00:00z", NOW),
        ("2025-12-01T09:30:00+01:30", NOW),
        ("2025-12-01T08:00:00.250Z", NOW + 0.25),
        ("2025-12-01", NOW - 8 * 3600),
        ("now", NOW),
        ("now-2h", NOW - 7200),
        ("now-1d12h", NOW - 1.5 * 86400),
    ],
)
def test_a_point_in_time_is_written_as_people_write_it(text, seconds):
    from gpuscale.config import parse_instant

    assert parse_instant(text, now=NOW) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("yesterday", "is not Unix seconds, RFC 3339"),
        ("2025-12-01T08:00:00", "has no time zone"),
        ("now-soon", '"now-" takes a duration'),
        ("nan", "is not Unix seconds"),
    ],
)
def test_report_end_refuses_what_it_cannot_read_in_one_line(capsys, text, said):
    assert main(["report", "--prometheus-url", "http://127.0.0.1:1", "--end", text]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"gpuscale report: --end: '{text}'"), line
    assert said in line, line


def test_report_end_accepts_rfc3339_and_relative_times():
    from gpuscale.cli.main import _parse
    from gpuscale.cli.report import ReportSettings
    from gpuscale.settings import from_arguments

    def end(text: str) -> float:
        args = _parse(["report", "--prometheus-url", "http://p:9090", "--end", text], "gpuscale")
        return from_arguments(ReportSettings, args).end

    assert end("2025-12-01T08:00:00Z") == NOW == end("1764576000")
    import time

    assert abs(end("now-1h") - (time.time() - 3600)) < 60


async def test_a_start_that_fails_at_its_port_releases_what_it_took(monkeypatch):
    """start_adapter enters each resource on one exit stack: a port already in use ends the start with one line
    naming the flag, and the source the earlier step opened is closed (issue 33 item 2)."""
    from gpuscale.cli.adapter import start_adapter
    from gpuscale.errors import ConfigError
    from gpuscale.settings import AdapterSettings
    from gpuscale.sources.scrape import ScrapeSource

    closed: list[ScrapeSource] = []
    close = ScrapeSource.close

    async def recording_close(self: ScrapeSource) -> None:
        closed.append(self)
        await close(self)

    monkeypatch.setattr(ScrapeSource, "close", recording_close)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = AdapterSettings(scrape_url=["http://127.0.0.1:9/metrics"], insecure_port=port)
        with pytest.raises(ConfigError, match=rf"^--insecure-port: cannot listen on 127.0.0.1:{port}"):
            await start_adapter(settings)
    assert len(closed) == 1
