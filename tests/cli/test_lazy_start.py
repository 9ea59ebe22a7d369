"""`gpuscale --help` starts without loading any subcommand: no numpy, pydantic or asyncio, so it answers in the
interpreter's own start-up time (benchmarks/bench_cli_start.py measures it); a subcommand loads only its own."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("numpy", "pydantic", "asyncio", "gpuscale.cli.top", "gpuscale.cli.simulate", "gpuscale.settings")


def _modules_after(*argv: str) -> set[str]:
    code = (
        "import sys\n"
        "from gpuscale.cli.main import main\n"
        "try:\n"
        f"    main({list(argv)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split("\n")[-2].split())


def test_help_loads_no_subcommand():
    loaded = _modules_after("--help")
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_a_subcommand_loads_its_own_flags_only():
    loaded = _modules_after("report", "--help")
    assert "gpuscale.cli.report" in loaded
    assert not loaded & {"gpuscale.cli.simulate", "gpuscale.cli.top", "gpuscale.replay.trace_replay"}
