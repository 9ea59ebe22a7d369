"""How fast the `gpuscale` command starts: `gpuscale --help` and each subcommand's `--help`, as a user runs them.

Each command runs in a fresh process (the installed console script of this checkout's .venv), alternating
repeat by repeat with its peers so machine noise hits all alike. Peers in the same run: the interpreter alone
(`python -c pass`, the floor) and the eager parser this command used to build (every subcommand's flags and
settings imported: `gpuscale.cli.main._parser()` with every subcommand). Also printed: the slowest imports of
`gpuscale top --help` from `python -X importtime` (the part of a one-shot `gpuscale top` spent before it
starts). Goal (issue 21 item 6): `gpuscale --help` ≤ 0.3 s.

    .venv/bin/python benchmarks/bench_cli_start.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
GPUSCALE = str(BIN / "gpuscale")
EAGER = "from gpuscale.cli.main import _parser; _parser()[0].parse_args(['--help'])"
COMMANDS = {
    "gpuscale --help": [GPUSCALE, "--help"],
    "gpuscale top --help": [GPUSCALE, "top", "--help"],
    "gpuscale simulate --help": [GPUSCALE, "simulate", "--help"],
    "gpuscale report --help": [GPUSCALE, "report", "--help"],
    "peer: every subcommand's flags (the eager parser)": [sys.executable, "-c", EAGER],
    "peer: python -c pass": [sys.executable, "-c", "pass"],
}


def _wall(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - began


def _slowest_imports(command: list[str], count: int) -> list[tuple[int, str]]:
    """(cumulative µs, module) of the top-level imports, slowest first."""
    done = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            f"import sys; sys.argv={['gpuscale', *command[1:]]!r}; from gpuscale.cli.main import main; main()",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if name.startswith("   ") or not cumulative.strip().isdigit():  # nested deeper than one level
            continue
        rows.append((int(cumulative), name.strip()))
    return sorted(rows, reverse=True)[:count]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for command in COMMANDS.values():  # warm the page cache once
        _wall(command)
    for _ in range(args.repeats):
        for name, command in COMMANDS.items():
            times[name].append(_wall(command))
    print(f"Python {sys.version.split()[0]}; wall seconds per start, median of {args.repeats} [best]\n")
    for name, values in times.items():
        print(f"{name:55} {statistics.median(values):6.3f} [{min(values):.3f}]")
    print("\nslowest imports under `gpuscale top --help` (cumulative ms):")
    for micros, module in _slowest_imports(COMMANDS["gpuscale top --help"], 8):
        print(f"  {micros / 1000:7.1f}  {module}")


if __name__ == "__main__":
    main()
