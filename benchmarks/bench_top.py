"""`gpuscale top pods -A` over a simulated 1,250-node × 8-GPU cluster: CPU time from "data arrived" to the table.

The cluster is generated with the simulator's own renderers (``sim.exporters.render_dcgm`` for one
dcgm-exporter per node, signals from ``sim.load``; Triton scrapes from the project fixtures for every
inference pod) and fed through the exact code ``gpuscale top`` runs after its scrapes, without HTTP:
the ``ScrapeSource`` that ``top`` builds (same ``series=``), its ``SourcesCollector.build`` (attribution →
devices → diagnosis → pod roll-ups → Triton ratio via the catalogue), ``sort_items`` and the table
formatter at 120 columns. Stages, each timed with ``time.process_time`` (CPU) and ``perf_counter`` (wall):

    parse    exposition text → samples (the parser; in ``top`` it runs per scrape, as each body arrives)
    ingest   samples → the scrape source's latest values (what ``ScrapeSource`` does after a parse)
    build    source values → GpuTopList of pods (attribution, read_devices, diagnose, combine, Triton)
    render   sort + table formatter → the string printed

"data arrived" = ingest + build + render (the goal: ≤ 1 s); with parse it is "scrape bodies in memory".
Each repeat runs in a fresh process forked from the one holding the generated text, as a one-shot
``top`` starts from a fresh interpreter. Also timed: the next ``--watch`` frame over the same series (the
attribution memo warm). Peers measured in the same run: the adapter's refresh (``build_snapshot`` over the
whole catalogue, on the same source) and ``rich.table.Table`` rendering the same rows (``--no-rich-peer``
skips it: ~4 s). ``--no-triton`` leaves out the inference endpoints (dcgm-exporters only).

    .venv/bin/python benchmarks/bench_top.py [--nodes 1250] [--repeats 5] [--no-rich-peer] [--no-triton]

``--dump DIR`` times nothing: it writes what `top` prints for this fleet (views pods, gpus and nodes; -A and
-n team-03; table, wide and json; default, verdict and util order) into DIR, one file each, so that two
checkouts can be compared byte for byte (``diff -r``) after a change meant to keep the output as it is.
"""

from __future__ import annotations

import argparse
import gc
import io
import multiprocessing
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscale.cli.top import TopSettings, _metrics_sources
from gpuscale.metrics.aggregation import build_snapshot
from gpuscale.metrics.attribution import Attributor
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.diagnosis import load_policy
from gpuscale.metrics.exposition import parse_samples
from gpuscale.pipeline import cyclic_gc_paused
from gpuscale.sim.device_gauges import device_signals
from gpuscale.sim.exporters import render_dcgm
from gpuscale.sim.gpu_activity import H100_SXM, activity
from gpuscale.sim.gpu_nodes import GpuSlot, SimNode
from gpuscale.sim.load import unit_hash
from gpuscale.sources.scrape import ScrapeSource
from gpuscale.sources.targets import target_resolver
from gpuscale.top.collect import SourcesCollector, inference_catalogue
from gpuscale.top.columns import RenderOptions
from gpuscale.top.render import render
from gpuscale.top.selection import Selection
from gpuscale.top.sorting import sort_items

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "triton"
NAMESPACES = tuple(f"team-{i:02d}" for i in range(12))
# (profile, container, share of GPUs); training pods take a whole node (8 GPUs), the rest 1 GPU each.
MIX = (("inference", "triton-server", 0.35), ("llm-decode", "nim-llm", 0.15), ("batch-light", "encoder", 0.10))
MIX += (("idle", "notebook", 0.05),)
TRAINING_NODES = 0.20


def cluster(nodes: int, seed: int = 11) -> tuple[dict[str, str], dict[str, str], int]:
    """dcgm-exporter text per URL, ``NAMESPACE/POD=URL`` Triton targets, and the number of pods."""
    dcgm: dict[str, str] = {}
    triton: dict[str, str] = {}
    pods = 0
    for n in range(nodes):
        name = f"ip-10-{n // 250}-{n % 250}-{(n * 37) % 250}.ec2.internal"
        node = SimNode.build(name, hardware=H100_SXM, seed=seed, instance_type="p5.48xlarge")
        signals: dict[int, Any] = {}
        holders: dict[GpuSlot, tuple[str, str, str]] = {}
        training = unit_hash(seed, name, "training") < TRAINING_NODES
        for gpu in node.gpus:
            v = 2 * unit_hash(seed, gpu.uuid) - 1
            if training:
                profile, container = "training", "pytorch"
                owner = (NAMESPACES[n % len(NAMESPACES)], f"finetune-{n:04d}-0", container)
            else:
                roll, profile, container = unit_hash(seed, gpu.uuid, "mix"), None, ""
                for p, c, share in MIX:
                    if roll < share:
                        profile, container = p, c
                        break
                    roll -= share
                ns = NAMESPACES[int(unit_hash(seed, gpu.uuid, "ns") * len(NAMESPACES))]
                owner = (ns, f"{profile}-{n:04d}-{gpu.index}", container) if profile else None
            u = unit_hash(seed, gpu.uuid, "load")
            signals[gpu.index] = device_signals(node.gpus[0].hardware, activity(profile, u, variation=v), variation=v)
            if owner is not None:
                holders[GpuSlot(gpu.index)] = owner
                if profile == "inference":
                    triton[f"{owner[0]}/{owner[1]}"] = f"http://10.{n // 250}.{n % 250}.{gpu.index}:8002/metrics"
        pods += len({h[1] for h in holders.values()})
        url = f"http://10.{n // 250}.{n % 250}.200:9400/metrics"
        dcgm[url] = render_dcgm(node, signals, pods_by_gpu=holders)
    return dcgm, {url: who for who, url in triton.items()}, pods


class Stages:
    """CPU (``process_time``) and wall (``perf_counter``) seconds per named stage, one entry per repeat."""

    def __init__(self) -> None:
        self.cpu: dict[str, list[float]] = defaultdict(list)
        self.wall: dict[str, list[float]] = defaultdict(list)

    @contextmanager
    def timing(self, stage: str) -> Iterator[None]:
        cpu, wall = time.process_time(), time.perf_counter()
        yield
        self.cpu[stage].append(time.process_time() - cpu)
        self.wall[stage].append(time.perf_counter() - wall)

    def total(self, name: str, parts: tuple[str, ...]) -> None:
        for series in (self.cpu, self.wall):
            series[name] = [sum(values) for values in zip(*(series[p] for p in parts), strict=True)]

    def line(self, label: str, stage: str, note: str = "") -> str:
        cpu = statistics.median(self.cpu[stage]) * 1e3
        best = min(self.cpu[stage]) * 1e3
        wall = statistics.median(self.wall[stage]) * 1e3
        return f"{label:<46} {cpu:>7.0f} [{best:>5.0f}] {wall:>8.0f}  {note}".rstrip()


@dataclass
class Cluster:
    """What every repeat starts from: the exporters' text, and what `top` is asked."""

    dcgm: dict[str, str]
    triton_targets: dict[str, str]
    t0_text: str
    t1_text: str
    settings: TopSettings


def one_run(cluster: Cluster, repeat: int) -> tuple[Stages, str, int]:
    """One `top pods -A` from scrape bodies to table, in a fresh process (a one-shot `top` is one)."""
    stages = Stages()
    policy = load_policy()
    inference = inference_catalogue(load_catalogue())
    full_catalogue = load_catalogue()
    triton_targets = cluster.triton_targets
    bodies = {**cluster.dcgm, **dict.fromkeys(triton_targets, cluster.t1_text)}
    now = 1_790_000_000.0 + 100 * repeat
    sources, explicit = _metrics_sources(cluster.settings, inference, max_age=60.0)
    (source,) = sources
    assert isinstance(source, ScrapeSource)
    t0_samples = parse_samples(cluster.t0_text)
    for url in triton_targets:  # the previous refresh's Triton scrape: rates need two (not timed)
        source.ingest(url, t0_samples, timestamp=now - 15)
    collector = SourcesCollector(
        sources,
        Attributor(target_resolver(explicit, None)),
        selection=Selection("pods", None, None, None),
        policy=policy,
        inference=inference,
        max_age_seconds=60.0,
    )
    gc.collect()
    with cyclic_gc_paused():  # NB: as `top` runs a frame
        with stages.timing("parse"):
            parsed = {url: parse_samples(text, source=url) for url, text in bodies.items()}
        with stages.timing("ingest"):
            for url, samples in parsed.items():
                source.ingest(url, samples, timestamp=now)
        with stages.timing("build"):
            doc = collector.build([], now=now)
        options_ = RenderOptions(policy, doc.scope, width=120)
        with stages.timing("render"):
            ordered = doc.model_copy(update={"items": sort_items("pods", doc.items, None)})
            table_text = render(ordered, "table", options_).plain()
        with stages.timing("json"):
            render(doc, "json", options_).plain()
        for url, samples in parsed.items():  # the next --watch frame: same series, warm attribution memo
            source.ingest(url, samples, timestamp=now + 2)
        with stages.timing("build-warm"):
            collector.build([], now=now + 2)
        attributor = Attributor(target_resolver(explicit, None))
        with stages.timing("adapter"):
            build_snapshot(full_catalogue, source.read, attributor, now=now)
    return stages, table_text, len(doc.items)


def dump(data: Cluster, directory: Path) -> None:
    """Every view's output on this fleet, one file per (view, scope, format, order): see ``--dump``."""
    directory.mkdir(parents=True, exist_ok=True)
    policy, inference = load_policy(), inference_catalogue(load_catalogue())
    now = 1_790_000_000.0
    for view in ("pods", "gpus", "nodes"):
        settings = data.settings.model_copy(update={"view": view})
        sources, explicit = _metrics_sources(settings, inference, max_age=60.0)
        (source,) = sources
        assert isinstance(source, ScrapeSource)
        t0_samples = parse_samples(data.t0_text)
        for url in data.triton_targets:
            source.ingest(url, t0_samples, timestamp=now - 15)
        for url, text in {**data.dcgm, **dict.fromkeys(data.triton_targets, data.t1_text)}.items():
            source.ingest(url, parse_samples(text, source=url), timestamp=now)
        for namespace in (None, "team-03"):
            selection = Selection(view, None if view == "nodes" else namespace, None, None)
            collector = SourcesCollector(
                sources,
                Attributor(target_resolver(explicit, None)),
                selection=selection,
                policy=policy,
                inference=inference,
                max_age_seconds=60.0,
            )
            doc = collector.build([], now=now)
            for output in ("table", "wide", "json"):
                for order in (None, "verdict", "util") if output != "json" else (None,):
                    options = RenderOptions(policy, doc.scope, width=120 if output == "table" else None)
                    ordered = doc.model_copy(update={"items": sort_items(view, doc.items, order)})
                    name = f"{view}-{namespace or 'all'}-{output}-{order or 'name'}.txt"
                    (directory / name).write_text(render(ordered, output, options).plain())
    print(f"wrote {len(list(directory.iterdir()))} files to {directory}")


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--nodes", type=int, default=1250, help="GPU nodes (8 × H100 each; default 1250)")
    options.add_argument("--repeats", type=int, default=5, help="timed repeats (default 5)")
    options.add_argument("--no-rich-peer", action="store_true", help="skip the rich.table.Table peer (~6 s)")
    options.add_argument("--no-triton", action="store_true", help="DCGM exporters only (no inference endpoints)")
    options.add_argument("--dump", type=Path, metavar="DIR", help="write every view's output into DIR, time nothing")
    args = options.parse_args()

    started = time.perf_counter()
    dcgm, triton_targets, pods = cluster(args.nodes)
    if args.no_triton:
        triton_targets = {}
    scrape_urls = [*dcgm, *(f"{who}={url}" for url, who in triton_targets.items())]
    data = Cluster(
        dcgm,
        triton_targets,
        (FIXTURES / "triton-t0.prom").read_text(),
        (FIXTURES / "triton.prom").read_text(),
        TopSettings(view="pods", all_namespaces=True, scrape_url=scrape_urls),
    )
    if args.dump:
        dump(data, args.dump)
        return 0
    size = sum(map(len, dcgm.values())) + len(triton_targets) * len(data.t1_text)
    print(
        f"Python {sys.version.split()[0]}; {args.nodes} nodes × 8 GPUs = {args.nodes * 8} GPUs, {pods} pods, "
        f"{len(triton_targets)} Triton endpoints; {size / 1e6:.1f} MB of exposition "
        f"text (generated in {time.perf_counter() - started:.1f} s)\n"
    )

    stages = Stages()
    table_text = ""
    rows = 0
    # NB: each repeat in a child forked from this process (which holds only the exporters' text), so every
    # repeat starts from the same memory state, as a one-shot `top` does; repeats in one process got ~15 %
    # slower each time as the heap of the previous ones fragmented.
    fork = multiprocessing.get_context("fork")
    for repeat in range(args.repeats):
        with ProcessPoolExecutor(max_workers=1, mp_context=fork) as pool:
            run, table_text, rows = pool.submit(one_run, data, repeat).result()
        for stage in run.cpu:
            stages.cpu[stage] += run.cpu[stage]
            stages.wall[stage] += run.wall[stage]

    stages.total("arrived", ("ingest", "build", "render"))
    stages.total("bodies", ("parse", "ingest", "build", "render"))
    stages.total("warm", ("ingest", "build-warm", "render"))
    width = max(len(line) for line in table_text.splitlines())
    print(f"`top pods -A`: {rows} rows, table {width} columns wide; median of {args.repeats} repeats [best]\n")
    print(f"{'stage':<46} {'CPU ms':>15} {'wall ms':>8}")
    print("-" * 71)
    print(stages.line("parse (exposition text → samples)", "parse"))
    print(stages.line("ingest (samples → scrape source)", "ingest"))
    print(stages.line("build (devices, diagnosis, pods, Triton)", "build"))
    print(stages.line("render (sort + 120-column table)", "render"))
    print("-" * 71)
    print(stages.line("data arrived → table (ingest+build+render)", "arrived", "goal ≤ 1000"))
    print(stages.line("scrape bodies → table (parse+…+render)", "bodies"))
    print(stages.line("  -o json instead of the table", "json"))
    print(stages.line("  --watch, next frame: data → table (warm memos)", "warm"))
    print("\nPeers on the same data:")
    adapter = statistics.median(stages.cpu["adapter"])
    build = statistics.median(stages.cpu["build"])
    print(
        f"  the adapter's refresh (build_snapshot, whole catalogue): {adapter * 1e3:.0f} ms CPU; "
        f"top's build is {build / adapter:.2f}× that"
    )
    if not args.no_rich_peer:
        from rich.console import Console
        from rich.table import Table

        lines = table_text.splitlines()
        header = lines[0].split()
        rich_table = Table(box=None, pad_edge=False)
        for h in header:
            rich_table.add_column(h, no_wrap=True, overflow="ellipsis")
        for line in lines[1 : rows + 1]:
            rich_table.add_row(*line.split()[: len(header)])
        console = Console(file=io.StringIO(), width=120, force_terminal=False)
        with stages.timing("rich"):
            console.print(rich_table)
        rich_cpu, ours = stages.cpu["rich"][0], statistics.median(stages.cpu["render"])
        print(
            f"  rich.table.Table, the same rows at 120 columns: {rich_cpu * 1e3:.0f} ms CPU; "
            f"top's table is {rich_cpu / ours:.0f}× faster"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
