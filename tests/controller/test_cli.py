"""`gpuscale controller` on bad input: one line naming the flag or file, exit status 2, no traceback."""

from __future__ import annotations

import pytest

from gpuscale.cli.main import main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--scrape-url: give --scrape-url (repeatable), --discover-exporters or --prometheus-url"),
        (
            ["--scrape-url", "http://a:9400/metrics", "--prometheus-url", "http://p:9090"],
            "--prometheus-url: give either",
        ),
        (["--prometheus-url", "http://p:9090", "--renew-deadline", "20s"], "--renew-deadline: needs --retry-period"),
        (["--prometheus-url", "http://p:9090", "--interval", "soon"], "--interval:"),
    ],
)
def test_bad_flags_are_one_line(capsys, args, message):
    assert main(["controller", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuscale controller: ") and message in err[0], err


def test_a_bad_policy_file_names_file_and_field(tmp_path, capsys):
    (tmp_path / "hints.yaml").write_text("version: 1\nidle: {below: 3}\nprotect: {gang_keys: [a]}\n")
    code = main(["controller", "--prometheus-url", "http://127.0.0.1:1", "--policies", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "hints.yaml" in err and "idle.below" in err and "Traceback" not in err


def test_no_cluster_is_one_line(tmp_path, capsys):
    code = main(["controller", "--prometheus-url", "http://127.0.0.1:1", "--kubeconfig", str(tmp_path / "none")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "kubeconfig" in err[0] and "does not exist" in err[0], err


def test_the_observer_counts_pools_remediations_and_idle_gpu_time():
    from prometheus_client import generate_latest

    from gpuscale.cli.controller import _observer
    from gpuscale.controller.metrics import ControllerMetrics
    from gpuscale.controller.telemetry import ClusterTelemetry, GpuTelemetry, NodeGpuTelemetry
    from gpuscale.controller.writes import StaticClusterView
    from gpuscale.metrics.diagnosis import GpuSignals

    def node(name: str, pool: str, **annotations: str) -> dict:
        labels = {"karpenter.sh/nodepool": pool, "nvidia.com/gpu.present": "true"}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
        }

    view = StaticClusterView([node("a", "p1", **{"gpuscale.io/gpu-health": "{}"}), node("b", "p1"), node("c", "p2")])
    idle = GpuTelemetry("b", "0", None, GpuSignals(), 0.0, pod=("ml", "nb"), idle_seconds=4000)
    busy = GpuTelemetry("b", "1", None, GpuSignals(), 0.0, pod=("ml", "job"), idle_seconds=0)
    tel = ClusterTelemetry(0.0, 600.0, {"b": NodeGpuTelemetry("b", True, {"0": idle, "1": busy})})
    metrics = ControllerMetrics()
    observe = _observer(metrics, 3600.0, ("karpenter.sh/nodepool",))
    observe(view, tel, 1000.0)
    observe(view, tel, 1060.0)
    text = generate_latest(metrics.registry).decode()
    assert 'gpuscale_controller_idle_gpus{node="b"} 1.0' in text
    assert "gpuscale_controller_idle_gpu_seconds_total 60.0" in text
    assert 'gpuscale_controller_pool_nodes{pool="p1"} 2.0' in text and "gpuscale_controller_pools 2.0" in text
    assert "gpuscale_controller_remediated_nodes 1.0" in text


async def test_a_dry_run_takes_no_lease(tmp_path):
    from gpuscale.cli.controller import start_controller
    from gpuscale.settings import ControllerSettings
    from gpuscale.sim.kubeapi import SimKubeApi

    async with SimKubeApi() as api:
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuscale"}})
        settings = ControllerSettings(
            kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"),
            scrape_url=["http://127.0.0.1:1/metrics"],
            dry_run=True,
            port=0,
            bind_address="127.0.0.1",
        )
        running = await start_controller(settings)
        try:
            assert running.elector is None
            await running.cache.wait_synced(timeout=10)
            result = await running.controller.reconcile_once()
            assert result.leading and result.outcomes == []
            assert api.list("coordination.k8s.io/v1", "Lease", namespace="gpuscale") == []
            assert "no telemetry source answered" in "; ".join(running.ready())
        finally:
            await running.stop()
