"""`gpuscale` entry point: parse flags (derived from settings), run one subcommand, map errors to messages.

NB: only the subcommand typed is imported and gets its flags (``gpuscale --help`` imports nothing but this
module: ~0.05 s instead of ~1.2 s with numpy, pydantic and every subcommand's settings loaded).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscale import __version__
from gpuscale.errors import GpuscaleError

if TYPE_CHECKING:
    import asyncio

    from gpuscale.settings import AdapterSettings


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help, what adds its flags and what runs it from the parsed flags (both import
    the subcommand's settings only when called, so ``gpuscale --help`` loads none)."""

    help: str
    add_flags: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]


def _adapter_flags(parser: argparse.ArgumentParser) -> None:
    from gpuscale.settings import AdapterSettings, add_arguments

    add_arguments(parser, AdapterSettings)


def _adapter(args: argparse.Namespace) -> None:
    from gpuscale.settings import AdapterSettings, from_arguments

    settings = from_arguments(AdapterSettings, args)
    _serve(settings.logging.log_level, lambda stop: _run_adapter(settings, stop))


def _demo_flags(parser: argparse.ArgumentParser) -> None:
    from gpuscale.settings import DemoSettings, add_arguments

    add_arguments(parser, DemoSettings)


def _demo(args: argparse.Namespace) -> None:
    from gpuscale.cli.demo import run_demo
    from gpuscale.settings import DemoSettings, from_arguments

    settings = from_arguments(DemoSettings, args)
    _serve(settings.logging.log_level, lambda stop: run_demo(settings, stop))


def _top_flags(parser: argparse.ArgumentParser) -> None:
    from gpuscale.cli.top import add_top_arguments

    add_top_arguments(parser)


def _top(args: argparse.Namespace) -> None:
    from gpuscale.cli.top import TopSettings, run_top
    from gpuscale.settings import from_arguments

    settings = from_arguments(TopSettings, args)
    _serve(settings.logging.log_level, lambda stop: run_top(settings, stop))


def _controller_flags(parser: argparse.ArgumentParser) -> None:
    from gpuscale.settings import ControllerSettings, add_arguments

    add_arguments(parser, ControllerSettings)


def _controller(args: argparse.Namespace) -> None:
    from gpuscale.cli.controller import run_controller
    from gpuscale.settings import ControllerSettings, from_arguments

    settings = from_arguments(ControllerSettings, args)
    _serve(settings.logging.log_level, lambda stop: run_controller(settings, stop))


def _report_flags(parser: argparse.ArgumentParser) -> None:
    from gpuscale.cli.report import add_report_arguments

    add_report_arguments(parser)


def _report(args: argparse.Namespace) -> None:
    from gpuscale.cli.report import ReportSettings, run_report
    from gpuscale.settings import from_arguments

    run_report(from_arguments(ReportSettings, args))


def _simulate_flags(parser: argparse.ArgumentParser) -> None:
    from gpuscale.cli.simulate import SimulateSettings
    from gpuscale.settings import add_arguments

    add_arguments(parser, SimulateSettings)


def _simulate(args: argparse.Namespace) -> None:
    from gpuscale.cli.simulate import SimulateSettings, main_simulate
    from gpuscale.settings import from_arguments

    main_simulate(from_arguments(SimulateSettings, args))


def _backtest_flags(parser: argparse.ArgumentParser) -> None:
    from gpuscale.cli.backtest import BacktestSettings
    from gpuscale.settings import add_arguments

    add_arguments(parser, BacktestSettings)


def _backtest(args: argparse.Namespace) -> None:
    from gpuscale.cli.backtest import BacktestSettings, main_backtest
    from gpuscale.settings import from_arguments

    main_backtest(from_arguments(BacktestSettings, args))


COMMANDS: dict[str, Command] = {
    "adapter": Command("serve custom.metrics.k8s.io / external.metrics.k8s.io", _adapter_flags, _adapter),
    "demo": Command("start a simulated GPU cluster and the adapter, show what the HPA sees", _demo_flags, _demo),
    "top": Command("kubectl top for GPUs: nodes, pods or gpus, and what each GPU really does", _top_flags, _top),
    "controller": Command(
        "GPU health remediation and autoscaler hints from DCGM telemetry (writes to the cluster)",
        _controller_flags,
        _controller,
    ),
    "report": Command("right-sizing and idle GPU cost from utilization history", _report_flags, _report),
    "simulate": Command(
        "replay a request trace through HPA manifests: cost, queue time, SLO", _simulate_flags, _simulate
    ),
    "backtest": Command(
        "the adapter's forecast on your traffic (trace, rate CSV or Prometheus): p90 loss vs the last value",
        _backtest_flags,
        _backtest,
    ),
}


def _parser(
    prog: str = "gpuscale", *, flags_of: frozenset[str] | None = None
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and each subcommand's own (whose usage an error in that subcommand's flags prints).

    ``flags_of``: the subcommands whose flags are added (default: all of them)."""
    parser = argparse.ArgumentParser(prog=prog, description="GPU and inference metrics for the HPA.")
    # NB: the same version the image is tagged with (deploy/image) and gpuscale_build_info reports.
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {}
    for name, command in COMMANDS.items():
        commands[name] = sub.add_parser(name, help=command.help)
        if flags_of is None or name in flags_of:
            command.add_flags(commands[name])
    return parser, commands


def _typed_command(argv: list[str]) -> str | None:
    """The subcommand on the command line: the first word that is not an option (the top-level parser's
    options, --help and --version, take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _parse(argv: list[str] | None, prog: str) -> argparse.Namespace:
    words = sys.argv[1:] if argv is None else argv
    parser, commands = _parser(prog, flags_of=frozenset({_typed_command(words) or ""}))
    args, unknown = parser.parse_known_args(words)
    if unknown:
        # NB: argparse reports a subcommand's unknown flag from the top-level parser, with the top-level
        # usage; the user needs the usage of the subcommand they typed.
        commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


async def _until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await main(stop)


async def _run_adapter(settings: AdapterSettings, stop: asyncio.Event) -> None:
    import sys

    from gpuscale.cli.adapter import SWITCH_INTERVAL_S, start_adapter

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    adapter = await start_adapter(settings)
    logging.getLogger("gpuscale").info("serving the metrics APIs on %s", ", ".join(adapter.listening))
    try:
        await stop.wait()
    finally:
        await adapter.stop()


def _serve(log_level: str, main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run a long-lived subcommand until SIGINT/SIGTERM."""
    import asyncio

    _logging(log_level)
    asyncio.run(_until_signal(main))


def main(argv: list[str] | None = None, *, prog: str = "gpuscale") -> int:
    args = _parse(argv, prog)
    try:
        COMMANDS[args.command].run(args)
    except GpuscaleError as e:
        print(f"{prog} {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def kubectl_plugin() -> int:
    """`kubectl gpu …` runs `gpuscale …` (kubectl finds plugins as executables named kubectl-<name>)."""
    return main(sys.argv[1:], prog="kubectl gpu")


def _logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


if __name__ == "__main__":
    sys.exit(main())
