"""`gpuscale controller` as a user runs it: a real process against the simulated Kubernetes API and simulated
dcgm-exporters. It becomes ready, elects itself, remediates a GPU that reports a fatal Xid, shows it on /metrics,
and on SIGTERM releases its Lease and exits 0."""

from __future__ import annotations

import asyncio
import re
import signal

import aiohttp

from tests.adapter.test_selfmetrics import promtool_check
from tests.e2e.backends import free_port
from tests.e2e.controller_process import controller_command, controller_process, simulated_cluster, until

TAINT = "status-taint.cluster-autoscaler.kubernetes.io/gpu-unhealthy"


async def test_the_controller_process_remediates_and_reports(tmp_path):
    async with simulated_cluster(3) as (api, exporters):
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuscale"}})
        port = free_port()
        command = controller_command(
            api.write_kubeconfig(tmp_path / "kubeconfig"),
            exporters,
            port,
            *("--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "0.5s"),
            *("--identity", "e2e-replica", "--no-hints"),
        )
        base = f"http://127.0.0.1:{port}"
        async with controller_process(command, tmp_path / "stderr") as proc:
            await _remediates_and_reports(api, exporters, proc, base, tmp_path)


async def _remediates_and_reports(api, exporters, proc, base: str, tmp_path) -> None:
    async with aiohttp.ClientSession() as http:

        async def ready() -> bool:
            assert proc.returncode is None, (tmp_path / "stderr").read_text()
            try:
                async with http.get(f"{base}/readyz") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await until(ready)
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200
        exporters.sim.override_gpu("gpu-02", 1, last_xid=79, xid_window=((79, 1),))

        async def remediated() -> bool:
            node = api.get("v1", "Node", "gpu-02")
            return bool(node and node["spec"].get("unschedulable"))

        await until(remediated)
        node = api.get("v1", "Node", "gpu-02")
        assert TAINT in [t["key"] for t in node["spec"]["taints"]]
        text = ""

        async def counted() -> bool:
            nonlocal text
            async with http.get(f"{base}/metrics") as r:
                text = await r.text()
            return "gpuscale_controller_remediated_nodes 1.0" in text  # the view after the writes

        await until(counted)
        applied = r'gpuscale_controller_actions_total\{action="patch",planner="health",result="applied"\} [1-9]'
        assert re.search(applied, text)
        assert "gpuscale_controller_leader 1.0" in text
        assert 'gpuscale_controller_pool_nodes{pool="gpu-a"} 3.0' in text
        assert re.search(r'gpuscale_controller_source_up\{source="scrape",target="[^"]+"\} 1.0', text)
        code, out = await promtool_check(text.encode())
        assert code == 0, out
        lease = api.get("coordination.k8s.io/v1", "Lease", "gpuscale-controller", namespace="gpuscale")
        assert lease["spec"]["holderIdentity"] == "e2e-replica"

        # Every exporter failing: /readyz says so (and the node stays as it is: unknown is not recovered).
        for node in exporters.dcgm_urls:
            exporters.set_faults(node, status=503)
        exporters.sim.clear_overrides()

        async def unready() -> bool:
            async with http.get(f"{base}/readyz") as r:
                return r.status == 503 and "no telemetry source answered" in await r.text()

        await until(unready)
        assert api.get("v1", "Node", "gpu-02")["spec"]["unschedulable"] is True
        for node in exporters.dcgm_urls:
            exporters.set_faults(node)
        await until(ready)
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    lease = api.get("coordination.k8s.io/v1", "Lease", "gpuscale-controller", namespace="gpuscale")
    assert not lease["spec"].get("holderIdentity"), "released on SIGTERM"
    log = (tmp_path / "stderr").read_text()
    assert "action=patch object=Node/gpu-02 result=applied" in log


async def test_the_controller_waits_for_an_api_that_is_not_up_yet(tmp_path):
    async with simulated_cluster(1) as (api, exporters):
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        await api.go_away()
        port = free_port()
        command = controller_command(kubeconfig, exporters, port, "--no-leader-elect")
        async with controller_process(command, tmp_path / "stderr") as proc, aiohttp.ClientSession() as http:

            async def readyz() -> tuple[int, str]:
                assert proc.returncode is None, (tmp_path / "stderr").read_text()
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                        return r.status, await r.text()
                except aiohttp.ClientError:
                    return 0, ""

            async def waiting() -> bool:
                status, text = await readyz()
                return status == 503 and "discovery" in text

            await until(waiting)
            await api.come_back()

            async def ready() -> bool:
                return (await readyz())[0] == 200

            await until(ready)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0


async def test_two_dry_run_replicas_as_a_first_install_runs_them_only_look(tmp_path):
    """issue 34: the chart's and deploy/controller's defaults run two replicas with --dry-run (leader election on,
    as deployed). A dry run takes no Lease, so both reconcile: each has its would-be writes validated by the API
    server (dryRun=All), logs and counts them, and is ready; the node with a fatal Xid is left as it was."""
    async with simulated_cluster(3) as (api, exporters):
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuscale"}})
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        ports = {name: free_port() for name in ("replica-a", "replica-b")}
        commands = {
            name: controller_command(kubeconfig, exporters, port, "--dry-run", "--identity", name, "--no-hints")
            for name, port in ports.items()
        }
        exporters.sim.override_gpu("gpu-02", 1, last_xid=79, xid_window=((79, 1),))
        async with (
            controller_process(commands["replica-a"], tmp_path / "a.stderr") as a,
            controller_process(commands["replica-b"], tmp_path / "b.stderr") as b,
            aiohttp.ClientSession() as http,
        ):
            texts: dict[str, str] = {}

            async def both_counted_dry_runs() -> bool:
                for (name, port), proc in zip(ports.items(), (a, b), strict=True):
                    assert proc.returncode is None, (tmp_path / f"{name[-1]}.stderr").read_text()
                    try:
                        async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                            if r.status != 200:
                                return False
                        async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                            texts[name] = await r.text()
                    except aiohttp.ClientError:
                        return False
                dry = r'gpuscale_controller_actions_total\{action="patch",planner="health",result="dry-run"\} [1-9]'
                return all(re.search(dry, t) for t in texts.values())

            await until(both_counted_dry_runs)
            for text in texts.values():
                assert "gpuscale_controller_dry_run 1.0" in text
                assert "gpuscale_controller_leader 0.0" in text  # no Lease taken: not two leaders on the dashboard
                assert not re.search(r'result="applied"\} [1-9]', text), text
            node = api.get("v1", "Node", "gpu-02")
            assert not node["spec"].get("unschedulable") and not node["spec"].get("taints"), node["spec"]
            assert api.list("coordination.k8s.io/v1", "Lease", namespace="gpuscale") == []
            a.send_signal(signal.SIGTERM)
            b.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(a.wait(), 20) == 0 and await asyncio.wait_for(b.wait(), 20) == 0
        for name in ("a", "b"):
            log = (tmp_path / f"{name}.stderr").read_text()
            assert "action=patch object=Node/gpu-02 result=dry-run" in log, log[-2000:]
