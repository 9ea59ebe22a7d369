"""Attribution's placement shortcut: the label values ``dcgm_placement`` returns decide a DCGM series' device.

``read_devices`` groups series by these values instead of attributing every label set, so the property
that makes that safe is tested directly: labels outside the placement never move a series to another
device, pod or node, and every placement label can.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuscale.metrics.attribution import _DCGM_PLACEMENT_LABELS, Target, attribute, dcgm_placement
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
