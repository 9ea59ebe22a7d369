"""Attribution's placement shortcut: the label values ``dcgm_placement`` returns decide a DCGM series' device.

``read_devices`` groups series by these values instead of attributing every label set, so the property
that makes that safe is tested directly: labels outside the placement never move a series to another
device, pod or node, and every placement label can.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuscale.metrics.attribution import _DCGM_PLACEMENT_LABELS, _PLACEMENT_LABELS, Target, attribute, dcgm_placement
from gpuscale.model import pod

VALUES = st.sampled_from(["", "0", "1", "GPU-a", "GPU-b", "team-a", "infer-0", "node-1", "dcgm-exporter-x"])
PLACEMENT = st.dictionaries(st.sampled_from(_DCGM_PLACEMENT_LABELS), VALUES, max_size=8)
OTHER = st.dictionaries(
    st.sampled_from(["err_code", "err_msg", "xid", "modelName", "pci_bus_id", "device", "window_size_in_ms"]),
    VALUES,
    max_size=4,
)
TARGETS = st.sampled_from(
    [
        Target("http://10.0.0.1:9400/metrics"),
        Target("http://10.0.0.2:9400/metrics", pod=pod("gpu-operator", "dcgm-exporter-x"), node="node-7"),
    ]
)


def placed(name: str, labels: dict[str, str], target: Target) -> tuple:
    device = attribute(name, labels, target)
    return device.key, device.physical, device.pod, device.node, device.objects


@given(PLACEMENT, OTHER, OTHER, TARGETS)
def test_labels_outside_the_placement_never_move_a_series(placement, extra_a, extra_b, target):
    a, b = placement | extra_a, placement | extra_b
    assert dcgm_placement(a) == dcgm_placement(b)
    assert placed("DCGM_FI_DEV_GPU_UTIL", a, target) == placed("DCGM_EXP_XID_ERRORS_COUNT", b, target)


@given(PLACEMENT, st.sampled_from(_DCGM_PLACEMENT_LABELS), VALUES)
def test_every_placement_label_is_part_of_the_placement(placement, key, value):
    changed = placement | {key: value}
    if changed.get(key) != placement.get(key):
        assert dcgm_placement(changed) != dcgm_placement(placement)


def test_the_exporter_page_of_one_gpu_is_one_placement_despite_xid_labels():
    gpu = {"gpu": "0", "UUID": "GPU-a", "Hostname": "node-1", "namespace": "team-a", "pod": "infer-0"}
    xid = gpu | {"err_code": "0", "err_msg": "No Error"}
    target = Target("http://10.0.0.1:9400/metrics")
    assert dcgm_placement(gpu) == dcgm_placement(xid)
    assert attribute("DCGM_FI_DEV_XID_ERRORS", xid, target).pod == pod("team-a", "infer-0")


# --- series that are not DCGM's (Triton, vLLM, a router's backends) -----------------------------------

SERIES_LABELS = st.dictionaries(
    st.sampled_from(["model", "version", "pod", "namespace", "server", "instance", "job", "engine", "le"]),
    st.sampled_from(["", "resnet", "1", "infer-0", "team-a", "http://10.0.0.9:8000", "a=b", "x y"]),
    max_size=6,
)


def series_reference(labels: dict[str, str], url: str) -> tuple[tuple, tuple]:
    """A series' key and external labels as attribution defines them: every label sorted by name, ``k=v``."""
    items = sorted(labels.items())
    external = tuple(item for item in items if item[0] not in _PLACEMENT_LABELS)
    return ("series", url, *[f"{k}={v}" for k, v in items]), external


@given(SERIES_LABELS, st.permutations(range(6)), TARGETS)
def test_a_series_key_and_selector_labels_are_its_own_in_any_label_order(labels, order, target):
    # NB: the sorted/formatted labels are shared between label sets (cached): written in another order, or
    # seen first at another target, a label set must still give its own key, with this target's URL.
    keys = list(labels)
    reordered = {keys[i]: labels[keys[i]] for i in order if i < len(keys)}
    other = Target("http://10.9.9.9:8002/metrics")
    for written in (labels, reordered):
        attribute("nv_inference_count", written, other)
        device = attribute("nv_inference_count", written, target)
        key, external = series_reference(labels, target.url)
        assert device.key == key and device.physical == key
        assert device.labels == external
