"""One room for the Prometheus query deadline: ``--prometheus-timeout``, a field of the PrometheusConnection group,
in every command that reads Prometheus, each with its own default; the client takes it from the group (bounded by
the adapter's refresh and the controller's --interval). ``gpuscale report --timeout``, its published old name, keeps
working and says it is deprecated.

The reads go to a socket that listens and never answers, so each one ends exactly at its deadline.
"""

from __future__ import annotations

import logging
import socket
import time

import pytest

from gpuscale.cli.main import _parser, main
from gpuscale.errors import SourceUnavailable
from gpuscale.settings import AdapterSettings, from_arguments
from tests.replay.test_history import HPA

DEFAULTS = {"adapter": "10s", "controller": "10s", "top": "3s", "report": "1m", "simulate": "1m", "backtest": "1m"}


@pytest.fixture
def silent():
    """The URL of a server that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(64)
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"


def _help(command: str, capsys) -> str:
    _, commands = _parser(flags_of=frozenset({command}))
    commands[command].print_help()
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(("command", "default"), sorted(DEFAULTS.items()))
def test_every_command_reading_prometheus_has_the_flag_with_its_own_default(command, default, capsys):
    shown = _help(command, capsys)
    described = shown.split("--prometheus-timeout PROMETHEUS_TIMEOUT deadline", 1)[1]
    assert described.split("(default: ", 1)[1].startswith(default + ")"), described[:200]


def test_report_shows_its_old_flag_as_deprecated(capsys):
    assert "--timeout PROMETHEUS_TIMEOUT deprecated: the old name of --prometheus-timeout" in _help("report", capsys)


@pytest.mark.parametrize(
    "args",
    [
        ["report", "--retries", "0", "--no-progress"],
        ["backtest", "--query", "up"],
        ["simulate", "--hpa", "{hpa}"],
        ["top", "gpus", "--rate-interval", "0"],
    ],
    ids=lambda args: args[0],
)
def test_each_command_reads_under_the_deadline_of_the_group(args, silent, tmp_path, capsys):
    hpa = tmp_path / "q.yaml"
    hpa.write_text(HPA)
    argv = [a.format(hpa=hpa) for a in args] + ["--prometheus-url", silent, "--prometheus-timeout", "200ms"]
    started = time.monotonic()
    assert main(argv) == 2
    took = time.monotonic() - started
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"gpuscale {args[0]}: ") and "timed out after 0.2s" in line, line
    assert took < 10, took


def test_reports_old_flag_still_sets_the_deadline_and_says_what_to_use(silent, capsys):
    assert main(["report", "--prometheus-url", silent, "--timeout", "200ms", "--retries", "0", "--no-progress"]) == 2
    warning, error = capsys.readouterr().err.strip().splitlines()
    assert warning == "gpuscale report: --timeout is deprecated; use --prometheus-timeout"
    assert "timed out after 0.2s" in error, error


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--timeout", "5s", "--prometheus-timeout", "6s"],
            "--timeout: give --prometheus-timeout or its deprecated name --timeout, not both",
        ),
        (["--timeout", "0"], "--timeout: Input should be greater than 0"),
        (["--prometheus-timeout", "soon"], "--prometheus-timeout: invalid duration 'soon'"),
        (["--prometheus-timeout", "1e400"], "--prometheus-timeout: '1e400' is not a finite duration"),
    ],
)
def test_a_bad_deadline_is_one_line(args, message, capsys):
    assert main(["report", "--prometheus-url", "http://127.0.0.1:9", *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"gpuscale report: {message}"), line


@pytest.mark.parametrize("command", [["adapter"], ["controller"], ["top", "gpus"], ["simulate"], ["backtest"]])
def test_a_bad_deadline_names_the_flag_in_every_command(command, capsys):
    assert main([*command, "--prometheus-url", "http://127.0.0.1:9", "--prometheus-timeout", "0"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"gpuscale {command[0]}: --prometheus-timeout: Input should be greater than 0", line


def _adapter(*argv: str) -> AdapterSettings:
    _, commands = _parser(flags_of=frozenset({"adapter"}))
    return from_arguments(AdapterSettings, commands["adapter"].parse_args(list(argv)))


async def test_the_adapters_refresh_reads_the_group_cut_to_the_refresh_and_says_so(silent, caplog):
    from gpuscale.cli.adapter import _prometheus_source
    from gpuscale.metrics.catalogue import load_catalogue

    caplog.set_level(logging.WARNING)
    catalogue = load_catalogue()
    for argv, deadline, cut in [
        (["--prometheus-timeout", "2s"], 2.0, False),
        ([], 5.0, False),  # NB: the default, 10 s, is cut to the default refresh quietly
        (["--prometheus-timeout", "30s"], 5.0, True),
    ]:
        caplog.clear()
        settings = _adapter("--prometheus-url", silent, "--no-prometheus-decode-process", *argv)
        source = _prometheus_source(settings, catalogue)
        try:
            assert source._timeout_seconds == deadline, argv
        finally:
            await source.close()
        said = "--prometheus-timeout 30s is longer than --refresh-interval 5s: reads time out after 5s"
        assert any(said in r.getMessage() for r in caplog.records) == cut, [r.getMessage() for r in caplog.records]


async def test_the_forecasts_history_query_has_the_adapters_deadline(silent):
    from gpuscale.cli.forecast_history import rate_history
    from gpuscale.metrics.catalogue import load_catalogue
    from gpuscale.metrics.demand import DemandSettings

    catalogue = load_catalogue()
    settings = _adapter("--prometheus-url", silent, "--prometheus-timeout", "300ms")
    metric = catalogue.get(settings.forecast_rate_metric)
    history = rate_history(settings, catalogue, metric, cluster=None, rate=DemandSettings())
    with pytest.raises(SourceUnavailable, match=r"timed out after 0\.3s"):
        await history(frozenset({"ml"}), time.time())
