"""The demo's trace slice loops without a cliff: every pass offers the same load, and the step from the last
minute into the first is no bigger than any step inside the slice; its speed-up fits one pass into --duration."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscale.cli.demo_replay import DemoReplay
from gpuscale.hpa import SYNC_PERIOD_SECONDS


@pytest.fixture(scope="module")
def replay() -> DemoReplay:
    return DemoReplay.load(phase_s=300.0)


def test_one_pass_of_the_slice_fits_the_duration(replay: DemoReplay) -> None:
    assert replay.slice_s == 30 * 60
    assert replay.speedup == pytest.approx(6.0)  # 30 trace-minutes in 300 s


def test_the_looped_load_repeats_and_runs_into_its_start_without_a_cliff(replay: DemoReplay) -> None:
    start = 42.0
    load, factor = replay.load_model(start_s=start, capacity_rps=100.0)
    pass_s = replay.slice_s / replay.speedup  # wall seconds per pass
    step = SYNC_PERIOD_SECONDS / replay.speedup  # what the HPA loop sees between two syncs
    t = start + np.arange(0.0, 3 * pass_s, step)
    rates = np.array([load.rate_at(x) for x in t])
    per_pass = len(t) // 3
    np.testing.assert_allclose(rates[:per_pass], rates[per_pass : 2 * per_pass], rtol=1e-9)
    np.testing.assert_allclose(rates[:per_pass], rates[2 * per_pass : 3 * per_pass], rtol=1e-9)
    jumps = np.abs(np.diff(rates))
    inside = jumps[2 : per_pass - 2].max()
    around_seams = [jumps[k - 2 : k + 2].max() for k in (per_pass, 2 * per_pass)]
    assert max(around_seams) <= inside, (around_seams, inside)
    assert rates.min() > 0 and factor > 0


def test_ready_time_is_whole_seconds(replay: DemoReplay) -> None:
    replay.ready_after = [15.0043, 14.9981, 30.0102]
    assert replay.startup_s == 15.0
    replay.ready_after = []
    assert replay.startup_s == float(SYNC_PERIOD_SECONDS)


def test_the_demo_summary_page_renders_without_a_ttft(replay: DemoReplay, tmp_path) -> None:
    """The live replay measures queue time only: its page says '–' where simulate's shows TTFT p95."""
    from gpuscale.replay.chart import write_html
    from gpuscale.replay.results import Event, ReplaySample

    timeline = [ReplaySample(t, 3, 3, 3, int(t // 10), 3, 60.0, 40.0) for t in (0.0, 15.0, 30.0, 75.0)]
    summary = replay.summary(timeline, [Event(30.0, 3, 4, "ScaleUp", "queue")], [0.1, 0.2, 0.3, 9.0])
    page = write_html(summary, tmp_path / "summary.html").read_text(encoding="utf-8")
    assert "<td>–</td>" in page and f"<td>{replay.hpa.name}</td>" in page


def test_the_banner_names_the_shipped_hpas_metrics_and_targets(replay: DemoReplay) -> None:
    from gpuscale.cli.demo_replay import targets_text

    expected = [
        f"{m['pods']['metric']['name']} {m['pods']['target']['averageValue']}"
        for m in replay.manifest()["spec"]["metrics"]
    ]
    assert targets_text(replay.hpa) == ", ".join(expected)
