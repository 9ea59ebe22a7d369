"""ScrapeSource.read_steps: what ``read`` gives, a few targets per step, and safe while targets come and go.

The adapter builds each snapshot on its serving loop in slices (metrics/steps.py); a term's rates over 1,000
Triton pods were ~25 ms of Python in one go, so the scrape source reads them target by target between pauses,
while its scrape thread (or discovery) may add or drop targets.
"""

from __future__ import annotations

from gpuscale.metrics.aggregation import queries
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.exposition import parse_samples
from gpuscale.metrics.steps import finish
from gpuscale.sources import scrape
from gpuscale.sources.scrape import ScrapeSource
from tests.helpers import run_counting_pauses

TARGETS = 40


def _page(i: int, count: float) -> str:
    return (
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-{i}",pod="p{i}",namespace="a"}} {i % 100}\n'
        f'nv_inference_request_success{{model="m",version="1"}} {count + i}\n'
    )


def _source() -> ScrapeSource:
    catalogue = load_catalogue()
    source = ScrapeSource([], series=catalogue.series_names, windowed_series=catalogue.windowed_series)
    for at, count in ((1000.0, 10.0), (1010.0, 70.0)):
        for i in range(TARGETS):
            source.ingest(f"http://10.0.0.{i}:9400/metrics", parse_samples(_page(i, count)), timestamp=at)
    return source


def test_read_steps_gives_what_read_gives_pausing_every_few_targets(monkeypatch):
    monkeypatch.setattr(scrape, "TARGETS_PER_STEP", 4)
    monkeypatch.setattr(scrape, "TARGETS_PER_WINDOWED_STEP", 2)
    source = _source()
    read_any = False
    for query in queries(load_catalogue()):
        (values, paused), whole = run_counting_pauses(source.read_steps(query)), source.read(query)
        assert values == whole
        read_any |= bool(values)
        per_step = 4 if query.input == "gauge" else 2
        assert paused == TARGETS // per_step, (query, paused)
    assert read_any


def test_targets_added_and_dropped_between_steps_do_not_break_a_read(monkeypatch):
    monkeypatch.setattr(scrape, "TARGETS_PER_STEP", 4)
    source = _source()
    query = next(q for q in queries(load_catalogue()) if q.series == ("DCGM_FI_DEV_GPU_UTIL",))
    steps = source.read_steps(query)
    next(steps)
    source.set_targets([f"http://10.0.0.{i}:9400/metrics" for i in range(TARGETS // 2)] + ["http://new:9400/metrics"])
    values = finish(steps)
    assert {v.labels["pod"] for v in values} <= {f"p{i}" for i in range(TARGETS)} and values
