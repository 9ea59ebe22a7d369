"""Exposition parser throughput: gpuscale's ``parse_samples`` against prometheus_client's text parser.

Both parse the same fixture in the same process, alternating repeat by repeat so that machine noise hits
both alike. The peer is measured consuming every sample (``text_string_to_metric_families`` is lazy).
Reported: the median time per scrape over the repeats (best in brackets), and the ratio of medians.
``--clock cpu`` times with the process's CPU clock instead of the wall clock: on a shared machine the other
jobs' preemptions then count for neither parser.

    .venv/bin/python benchmarks/bench_parser.py [--repeats N] [--min-seconds S] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpuscale.metrics.exposition import parse_samples

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
CASES = [
    ("dcgm 8×H100", FIXTURES / "dcgm" / "dcgm-exporter-h100-8gpu.prom"),
    ("triton (default flags)", FIXTURES / "triton" / "triton.prom"),
    ("triton (summaries+histograms)", FIXTURES / "triton" / "triton-summaries-histograms.prom"),
]


def ours(text: str) -> int:
    return len(parse_samples(text))


def prometheus_client(text: str) -> int:
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def loops_for(parse: Callable[[str], int], text: str, min_seconds: float) -> int:
    """Iterations per repeat so that one repeat lasts at least ``min_seconds`` (timer resolution, noise)."""
    loops = 1
    while True:
        started = clock()
        for _ in range(loops):
            parse(text)
        if clock() - started >= min_seconds:
            return loops
        loops *= 2


def per_scrape_us(parse: Callable[[str], int], text: str, loops: int) -> float:
    started = clock()
    for _ in range(loops):
        parse(text)
    return (clock() - started) / loops * 1e6


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--repeats", type=int, default=9, help="timed repeats per parser (default 9)")
    options.add_argument("--min-seconds", type=float, default=0.1, help="minimum length of one repeat")
    options.add_argument("--clock", choices=tuple(CLOCKS), default="wall", help="wall (default) or cpu time")
    args = options.parse_args()
    global clock
    clock = CLOCKS[args.clock]

    print(f"Python {sys.version.split()[0]}; median {args.clock} µs per scrape over {args.repeats} repeats [best]\n")
    header = f"{'fixture':<31} {'samples':>7} {'gpuscale µs':>18} {'prometheus_client µs':>22}  ratio"
    print(header)
    print("-" * len(header))
    for label, path in CASES:
        text = path.read_text()
        count = ours(text)
        if count != prometheus_client(text):
            # The fixtures hold no DCGM blanks, so both parsers must see the same samples.
            print(f"{label}: sample counts differ ({count} vs {prometheus_client(text)})", file=sys.stderr)
            return 1
        loops = {parse: loops_for(parse, text, args.min_seconds) for parse in (ours, prometheus_client)}
        times: dict[Callable[[str], int], list[float]] = {ours: [], prometheus_client: []}
        for _ in range(args.repeats):
            for parse in (ours, prometheus_client):
                times[parse].append(per_scrape_us(parse, text, loops[parse]))
        mine, peer = (statistics.median(times[p]) for p in (ours, prometheus_client))
        best_mine, best_peer = (min(times[p]) for p in (ours, prometheus_client))
        print(
            f"{label:<31} {count:>7} {mine:>9.0f} [{best_mine:>6.0f}] {peer:>13.0f} [{best_peer:>6.0f}]"
            f"  gpuscale is {peer / mine:.1f}x faster"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
