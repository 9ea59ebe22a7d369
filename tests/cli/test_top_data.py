"""The pure layers under `gpuscale top`: devices, roll-ups, sorting and rendering, without a process or a socket.

Scope: series → devices (MIG instances apart, Xid windows, the exporter's own pod, two URLs for one
exporter), power counted once per physical GPU in pod and node roll-ups, the table layout (fits the width,
cuts names the way that keeps them recognisable, aligns numbers), the legend (only verdicts shown, numbers
from the loaded policy), the registries (unknown sort key / format name the valid ones), the JSON
document round trip, and the adapter API's quantities. Fixture values are read from the fixture files.
"""

from __future__ import annotations

import re

import pytest

from gpuscale.errors import ConfigError
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.devices import DEVICE_SERIES, gpu_statuses, read_devices
from gpuscale.metrics.diagnosis import load_policy
from gpuscale.metrics.exposition import parse_samples
from gpuscale.metrics.rollups import node_statuses, pod_statuses
from gpuscale.model import parse_quantity, pod
from gpuscale.sources.base import SeriesValue
from gpuscale.sources.scrape import ScrapeSource
from gpuscale.top.columns import RenderOptions
from gpuscale.top.document import GpuTopList, Scope
from gpuscale.top.render import legend, render
from gpuscale.top.sorting import sort_items
from gpuscale.top.table import Column, cut, table
from tests.helpers import H100, MIG, T0

POLICY = load_policy()


def statuses(*scrapes: tuple[str, object], targets: dict[str, Target] | None = None):
    """Fixture files as if scraped from the given URLs, through ScrapeSource → read_devices → diagnosis."""
    source = ScrapeSource([], series=DEVICE_SERIES)
    for url, path in scrapes:
        source.ingest(url, parse_samples(path.read_text()), timestamp=T0)  # type: ignore[attr-defined]
    targets = targets or {}
    readings = read_devices(source.read, Attributor(lambda url: targets.get(url, Target(url))))
    return gpu_statuses(readings, POLICY)


def power_of(path, *, once_per_gpu: bool) -> float:
    seen: dict[str, float] = {}
    total = 0.0
    for s in parse_samples(path.read_text()):
        if s.name == "DCGM_FI_DEV_POWER_USAGE":
            total += s.value
            seen[s.labels["UUID"]] = s.value
    return sum(seen.values()) if once_per_gpu else total


# --- devices -------------------------------------------------------------------------------------------


def test_every_mig_instance_is_a_device_of_its_own():
    gpus = statuses(("http://a/metrics", MIG))
    ids = {g.device_id for g in gpus}
    assert {"0/2", "0/3", "0/9", "0/10", "1/1", "1/2", "2"} <= ids
    instance = next(g for g in gpus if g.device_id == "0/3")
    assert instance.mig_profile == "2g.20gb" and instance.signals.gpu_util_percent is None
    assert instance.namespace == "inference" and instance.pod


def test_power_is_counted_once_per_physical_gpu_in_node_and_pod_rollups():
    gpus = statuses(("http://a/metrics", MIG))
    (node,) = node_statuses(gpus, POLICY)
    assert power_of(MIG, once_per_gpu=True) < power_of(MIG, once_per_gpu=False)  # the trap is real here
    assert node.signals.power_watts == pytest.approx(power_of(MIG, once_per_gpu=True))
    assert node.gpus == len({g.uuid for g in gpus}) and node.devices == len(gpus)
    # A pod holding two instances of one GPU gets that GPU's power once.
    parent = next(g for g in gpus if g.device_id == "0/9")
    twins = [g.model_copy(update={"namespace": "t", "pod": "p"}) for g in gpus if g.uuid == parent.uuid][:2]
    (combined,) = pod_statuses(twins, POLICY)
    assert combined.gpus == 2 and combined.signals.power_watts == pytest.approx(parent.signals.power_watts)


def test_xid_windows_and_health_signals_reach_the_verdict():
    by_gpu = {g.gpu: g for g in statuses(("http://a/metrics", H100))}
    faulty = by_gpu["5"]
    xids = {int(s.labels["xid"]) for s in parse_samples(H100.read_text()) if s.name == "DCGM_EXP_XID_ERRORS_COUNT"
            and s.labels["gpu"] == "5"}  # fmt: skip
    assert set(faulty.signals.xid_counts or {}) == xids
    assert faulty.verdict.code == "unhealthy" and by_gpu["1"].verdict.code == "under-filled"


def test_the_exporters_own_pod_labels_do_not_make_a_workload():
    exporter_pod = pod("gpu-operator", "nvidia-dcgm-exporter-x")
    text = H100.read_text().replace('container="encoder",namespace="ml-batch",pod="embeddings-batch-28471-8xk2p"',
                                    'container="exporter",namespace="gpu-operator",pod="nvidia-dcgm-exporter-x"')  # fmt: skip
    source = ScrapeSource([], series=DEVICE_SERIES)
    source.ingest("http://e/metrics", parse_samples(text), timestamp=T0)
    attributor = Attributor(lambda url: Target(url, exporter_pod, "node-a"))
    by_gpu = {g.gpu: g for g in gpu_statuses(read_devices(source.read, attributor), POLICY)}
    assert by_gpu["7"].pod is None and by_gpu["7"].node == "node-a"
    assert by_gpu["1"].pod is not None


def test_one_exporter_under_two_urls_is_one_set_of_devices():
    gpus = statuses(("http://a/metrics", H100), ("http://b/metrics", H100))
    assert len(gpus) == 8


# --- rendering -----------------------------------------------------------------------------------------


def test_keep_reads_only_the_devices_asked_for_with_the_same_values():
    source = ScrapeSource([], series=DEVICE_SERIES)
    source.ingest("http://10.0.0.1:9400/metrics", parse_samples(H100.read_text()), timestamp=T0)
    every = read_devices(source.read, Attributor(Target))
    held = read_devices(source.read, Attributor(Target), keep=lambda device: device.pod is not None)
    assert 0 < len(held) < len(every)  # the fixture has idle GPUs without pod labels
    expected = [(r.device.key, r.values, r.xid_counts, r.sampled_at) for r in every if r.device.pod is not None]
    assert [(r.device.key, r.values, r.xid_counts, r.sampled_at) for r in held] == expected


@pytest.mark.parametrize("held_first", [True, False])
def test_keep_judges_a_gpu_reported_twice_as_filtering_the_merged_reading_would(held_first):
    # One GPU under two exporter URLs a scrape apart: one still labels the pod that held it, one has none.
    gpu = {"gpu": "0", "UUID": "GPU-0", "Hostname": "node-1"}
    held = gpu | {"pod": "infer-0", "namespace": "team-a"}
    first, second = (held, gpu) if held_first else (gpu, held)
    series = [
        SeriesValue("DCGM_FI_DEV_GPU_UTIL", first, 90.0, T0, "http://10.0.0.1:9400/metrics"),
        SeriesValue("DCGM_FI_DEV_XID_ERRORS", first, 0.0, T0, "http://10.0.0.1:9400/metrics"),
        SeriesValue("DCGM_FI_DEV_GPU_UTIL", second, 0.0, T0 + 1, "http://10.0.0.2:9400/metrics"),
        SeriesValue("DCGM_FI_DEV_XID_ERRORS", second, 79.0, T0 + 1, "http://10.0.0.2:9400/metrics"),
    ]

    def read(query):
        return [v for v in series if v.name in query.series]

    def in_scope(device):
        return device.pod is not None and device.pod.namespace == "team-a"

    def seen(readings):
        return [(r.device.key, r.device.pod, r.values, r.sampled_at) for r in readings]

    filtered_after = [r for r in read_devices(read, Attributor(Target)) if in_scope(r.device)]
    assert seen(read_devices(read, Attributor(Target), keep=in_scope)) == seen(filtered_after)
    assert len(filtered_after) == (1 if held_first else 0)  # the first placement decides, both ways


def test_table_fits_the_width_cutting_names_the_readable_way():
    columns = [
        Column("NODE", lambda r: r[0], cut="host", min_width=14, shrink_first=True),
        Column("POD", lambda r: r[1], cut="middle", min_width=18),
        Column("UTIL", lambda r: r[2], right=True),
    ]
    rows = [
        ("ip-10-0-131-77.ec2.internal", "inference/triton-inference-7d9f8b6c5-x2k4q", "63%"),
        ("ip-10-0-152-203.ec2.internal", "nim/llama3-8b-instruct-5c6b9d8f47-qz7mh", "100%"),
    ]
    out = table(columns, rows, width=52, headers=True)
    assert all(len(line) <= 52 for line in out.lines)
    assert out.lines[1].startswith("ip-10-0-131-77   ")  # the domain goes whole, the host stays
    assert "x2k4q" in out.lines[1] and "…" in out.lines[1]  # the pod's unique suffix survives
    assert out.lines[1].endswith(" 63%") and out.lines[2].endswith("100%")  # numbers right-aligned
    assert table(columns, rows, width=None, headers=False).lines[0].split()[1] == rows[0][1]  # no cut unbounded


SEPARATORS = "-_./:, "
NAMES = [
    "inference/triton-inference-7d9f8b6c5-x2k4q",
    "nim/llama3-8b-instruct-5c6b9d8f47-qz7mh",
    "ml-training/llm-finetune-worker-0",
    "llama-3-1-70b-instruct-speculative-decoding-canary-7f9c8d6b5d-qz7mh",
    "deployment/embeddings-batch",
]


@pytest.mark.parametrize("how", ["middle", "end"])
@pytest.mark.parametrize("name", NAMES)
def test_names_are_cut_between_segments_never_inside_a_word(name, how):
    """A narrow terminal shortens a name by whole segments with "…" where some went (issue 34: it used to
    break names mid-word, ``triton-infere…7d9f8b6c5-x2k4q``)."""
    longest_word = max(len(word) for word in re.split(f"[{re.escape(SEPARATORS)}]", name))
    for width in range(longest_word + 3, len(name)):  # NB: room for a separator, a word and "…"
        short = cut(name, width, how)
        head, ellipsis, tail = short.partition("…")
        assert ellipsis and len(short) <= width, (width, short)
        assert name.startswith(head) and name[len(head)] in SEPARATORS, (width, short)  # the head ends a word
        assert name.endswith(tail) and (not tail or tail[0] in SEPARATORS), (width, short)  # the tail starts one
        suffix = name[name.rfind("-") :]
        if how == "middle" and width >= longest_word + len(suffix) + 2:
            assert tail.endswith(suffix), (width, short)  # the pod's own suffix stays when a word fits beside it
    assert cut("supercalifragilisticexpialidocious-0", 12, "middle") == "supercalifr…"  # one word wider than the room


def test_a_row_too_wide_for_the_terminal_leaves_out_columns_not_words():
    """Names cut as far as they go and still too wide: whole columns go from the right, the row's identity and
    verdict stay, every line fits, and the frame names what is left out."""
    pods = pod_statuses(statuses(("http://a/metrics", H100)), POLICY)
    doc = GpuTopList(view="pods", generated_at=T0, scope=Scope(all_namespaces=True), items=pods)
    whole = render(doc, "table", RenderOptions(POLICY, Scope(all_namespaces=True), width=None))
    narrow = render(doc, "table", RenderOptions(POLICY, Scope(all_namespaces=True), width=80))
    header = whole.lines[0].split()
    shown = narrow.lines[0].split()
    assert all(len(line) <= 80 for line in narrow.lines), narrow.lines
    assert {"NAMESPACE", "POD", "VERDICT"} <= set(shown) and set(shown) < set(header)
    assert narrow.left_out == [h for h in header if h not in shown] and narrow.left_out
    verdicts = {line.split()[-1] for line in narrow.lines[1 : 1 + len(pods)]}
    assert verdicts == {p.verdict.code.value for p in pods}  # whole verdicts, one row a line
    note = " ".join(narrow.lines[narrow.lines.index(next(x for x in narrow.lines if "left out" in x)) :])
    assert all(h in note for h in narrow.left_out) and "left out to fit 80 columns" in note, narrow.lines


def test_legend_lists_the_verdicts_shown_with_the_policys_numbers(tmp_path):
    gpus = statuses(("http://a/metrics", H100))
    lines = legend("gpus", gpus, POLICY, width=None)
    codes = {line.split()[1] for line in lines[1:]}
    assert codes == {g.verdict.code.value for g in gpus}
    under = next(line for line in lines if " under-filled " in line)
    busy, ineffective = POLICY.diagnosis.busy.gpu_util_percent, POLICY.diagnosis.sm_active.ineffective
    assert f"GPU util ≥ {busy:g}%" in under and f"SM active < {ineffective * 100:g}%" in under


def test_sort_keys_and_formats_are_registries_that_name_the_valid_choices():
    gpus = statuses(("http://a/metrics", H100))
    hottest = sort_items("gpus", gpus, "temp")[0]
    assert hottest.signals.gpu_temp_c == max(g.signals.gpu_temp_c or 0 for g in gpus)
    assert sort_items("gpus", gpus, "verdict")[0].verdict.code == "unhealthy"
    with pytest.raises(ConfigError, match="valid: name, node, pod, util"):
        sort_items("gpus", gpus, "heat")
    doc = GpuTopList(view="gpus", generated_at=T0, items=gpus)
    with pytest.raises(ConfigError, match="valid: table, wide, json, yaml"):
        render(doc, "xml", RenderOptions(POLICY))


def test_json_document_round_trips():
    gpus = statuses(("http://a/metrics", H100))
    doc = GpuTopList(view="gpus", generated_at=T0, scope=Scope(namespace="x"), items=gpus)
    text = render(doc, "json", RenderOptions(POLICY)).plain()
    back = GpuTopList.model_validate_json(text)
    assert back.generated_at == T0
    assert [i.model_dump() for i in back.items] == [i.model_dump() for i in doc.items]
    assert '"physical"' not in text  # an internal key, not part of the document


QUANTITIES = [("87500m", 87.5), ("87", 87.0), ("1500k", 1.5e6), ("12Gi", 12 * 2**30), ("1e3", 1000.0), ("-5m", -0.005)]


@pytest.mark.parametrize(("text", "value"), QUANTITIES)
def test_adapter_quantities_parse(text, value):
    assert parse_quantity(text) == pytest.approx(value)


def test_a_non_quantity_is_refused():
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity("12 GB")
