"""Freeing piecemeal (gpuscale/piecemeal.py) and the pipeline's use of it for the snapshot a refresh replaced.

Scope: only containers nobody else holds are emptied, all the way down, and what another reader holds is left
whole and unchanged; the pipeline frees the replaced snapshot off the event loop when nothing holds it, and never a
snapshot a reader still holds.
"""

from __future__ import annotations

import gpuscale.pipeline
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.exposition import parse_samples
from gpuscale.metrics.steps import finish
from gpuscale.metrics.store import MetricsStore
from gpuscale.piecemeal import free_piecemeal
from gpuscale.pipeline import Pipeline
from gpuscale.sources.scrape import ScrapeSource


class Holder:
    def __init__(self, **containers: object) -> None:
        self.__dict__.update(containers)


def test_only_what_nobody_else_holds_is_emptied():
    shared_inner = {"kept": 1}
    shared_outer = {"a": [1, 2]}
    holder = Holder(
        values={"m": {"x": 1, "y": 2}, "n": shared_inner},
        members={"o": [object(), object()]},
        other=shared_outer,
    )
    inner = holder.values["m"]  # NB: another reader's hold on one inner dict
    inner_before = dict(inner)

    freed = finish(free_piecemeal(holder, ("values", "members", "other", "missing")))

    assert holder.values == {} and holder.members == {}
    assert inner == inner_before  # held elsewhere: left whole
    assert shared_inner == {"kept": 1}
    assert holder.other == {"a": [1, 2]}  # the outer container itself is held elsewhere (shared_outer)
    assert freed == 2 + 1 + 2  # values' two items, members' one and the two elements of its list, nothing else


def _pipeline(store: MetricsStore) -> tuple[Pipeline, ScrapeSource]:
    catalogue = load_catalogue()
    source = ScrapeSource([], series=catalogue.series_names, windowed_series=catalogue.windowed_series)
    return Pipeline(catalogue, source, store, Attributor(Target), clock=lambda: 1_790_000_000.0), source


def _ingest(source: ScrapeSource, value: float) -> None:
    text = "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-{i}",namespace="a",pod="p{i}"}} {value}\n' for i in range(3)
    )
    source.ingest("http://dcgm/metrics", parse_samples(text), timestamp=1_790_000_000.0)


async def test_the_replaced_snapshot_is_freed_off_the_loop_unless_a_reader_holds_it(monkeypatch):
    freed: list[tuple[int, int]] = []  # (values before, values after) of each snapshot freed

    def recording(snapshot, names):
        before = len(snapshot.values)
        yield from free_piecemeal(snapshot, names)
        freed.append((before, len(snapshot.values)))

    monkeypatch.setattr(gpuscale.pipeline, "free_piecemeal", recording)
    store = MetricsStore()
    pipeline, source = _pipeline(store)
    _ingest(source, 10)
    await pipeline.refresh_once()
    _ingest(source, 20)
    held = store.snapshot  # NB: a reader that still holds the current snapshot when the next refresh replaces it
    values = {m: dict(v) for m, v in held.values.items()}
    await pipeline.refresh_once()
    assert freed == []  # held: not freed
    assert {m: dict(v) for m, v in held.values.items()} == values and values
    del held

    _ingest(source, 30)
    await pipeline.refresh_once()
    assert len(freed) == 1 and freed[0][0] > 0 and freed[0][1] == 0
    assert store.snapshot.values  # the current one is untouched
    await source.close()
