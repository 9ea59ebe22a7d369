"""`gpuscale` entry point: parse flags (derived from settings), run one subcommand, map errors to messages."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

from gpuscale import __version__
from gpuscale.cli.report import ReportSettings, add_report_arguments, run_report
from gpuscale.cli.top import TopSettings, add_top_arguments, run_top
from gpuscale.errors import GpuscaleError
from gpuscale.settings import AdapterSettings, ControllerSettings, DemoSettings, add_arguments, from_arguments


def _parser(prog: str = "gpuscale") -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and each subcommand's own (whose usage an error in that subcommand's flags prints)."""
    parser = argparse.ArgumentParser(prog=prog, description="GPU and inference metrics for the HPA.")
    # NB: the same version the image is tagged with (deploy/image) and gpuscale_build_info reports.
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    adapter = sub.add_parser("adapter", help="serve custom.metrics.k8s.io / external.metrics.k8s.io")
    add_arguments(adapter, AdapterSettings)
    demo = sub.add_parser("demo", help="start a simulated GPU cluster and the adapter, show what the HPA sees")
    add_arguments(demo, DemoSettings)
    top = sub.add_parser("top", help="kubectl top for GPUs: nodes, pods or gpus, and what each GPU really does")
    add_top_arguments(top)
    controller = sub.add_parser(
        "controller", help="GPU health remediation and autoscaler hints from DCGM telemetry (writes to the cluster)"
    )
    add_arguments(controller, ControllerSettings)
    report = sub.add_parser("report", help="right-sizing and idle GPU cost from utilization history")
    add_report_arguments(report)
    from gpuscale.cli.simulate import SimulateSettings

    simulate = sub.add_parser("simulate", help="replay a request trace through HPA manifests: cost, queue time, SLO")
    add_arguments(simulate, SimulateSettings)
    return parser, {
        "adapter": adapter,
        "demo": demo,
        "top": top,
        "controller": controller,
        "report": report,
        "simulate": simulate,
    }


def _parse(argv: list[str] | None, prog: str) -> argparse.Namespace:
    parser, commands = _parser(prog)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # NB: argparse reports a subcommand's unknown flag from the top-level parser, with the top-level
        # usage; the user needs the usage of the subcommand they typed.
        commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


async def _until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await main(stop)


async def _run_adapter(settings: AdapterSettings, stop: asyncio.Event) -> None:
    from gpuscale.cli.adapter import start_adapter

    adapter = await start_adapter(settings)
    logging.getLogger("gpuscale").info("serving the metrics APIs on %s", ", ".join(adapter.listening))
    try:
        await stop.wait()
    finally:
        await adapter.stop()


def main(argv: list[str] | None = None, *, prog: str = "gpuscale") -> int:
    args = _parse(argv, prog)
    try:
        if args.command == "adapter":
            settings = from_arguments(AdapterSettings, args)
            _logging(settings.log_level)
            asyncio.run(_until_signal(lambda stop: _run_adapter(settings, stop)))
        elif args.command == "demo":
            from gpuscale.cli.demo import run_demo

            demo_settings = from_arguments(DemoSettings, args)
            _logging(demo_settings.log_level)
            asyncio.run(_until_signal(lambda stop: run_demo(demo_settings, stop)))
        elif args.command == "simulate":
            from gpuscale.cli.simulate import SimulateSettings, main_simulate

            main_simulate(from_arguments(SimulateSettings, args))
        elif args.command == "controller":
            from gpuscale.cli.controller import run_controller

            controller_settings = from_arguments(ControllerSettings, args)
            _logging(controller_settings.log_level)
            asyncio.run(_until_signal(lambda stop: run_controller(controller_settings, stop)))
        elif args.command == "top":
            top_settings = from_arguments(TopSettings, args)
            _logging(top_settings.log_level)
            asyncio.run(_until_signal(lambda stop: run_top(top_settings, stop)))
        elif args.command == "report":
            run_report(from_arguments(ReportSettings, args))
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
