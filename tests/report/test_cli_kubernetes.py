"""`gpuscale report` and the Kubernetes API (the simulated server): owners of pods kube-state-metrics did not
describe, and the CronJob's outputs (a directory, the ConfigMap its Role may patch), run as deploy/report runs it."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from gpuscale.sim.kubeapi import SimKubeApi
from gpuscale.sources.history_file import export_history
from tests.report.histories import add_pod, constant, history


def objects():
    meta = lambda name, ns="ml", owner=None: {  # noqa: E731
        "name": name,
        "namespace": ns,
        **(
            {
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": owner[0],
                        "name": owner[1],
                        "uid": f"u-{owner[1]}",
                        "controller": True,
                    }
                ]
            }
            if owner
            else {}
        ),
    }
    pod_spec = {"containers": [{"name": "main", "image": "x"}]}
    rs_spec = {
        "selector": {"matchLabels": {"app": "t"}},
        "template": {"metadata": {"labels": {"app": "t"}}, "spec": pod_spec},
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuscale"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpuscale-report", "namespace": "gpuscale"}},
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": meta("trainer-7d9f", owner=("Deployment", "trainer")),
            "spec": rs_spec,
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta("trainer-7d9f-abcde", owner=("ReplicaSet", "trainer-7d9f")),
            "spec": pod_spec,
        },
    ]


async def run(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuscale",
        "report",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def sim():
    api = SimKubeApi()
    await api.start()
    for obj in objects():
        api.create(obj)
    yield api
    await api.stop()


@pytest.fixture
def exported(tmp_path):
    h = history(hours=6)
    add_pod(h, pod="trainer-7d9f-abcde", owner=None, gpus=2, values=constant(sm_active=0.5))
    add_pod(h, pod="gone-pod", owner=None, node="node-b", values=constant(sm_active=0.5))
    path = tmp_path / "history.npz"
    export_history(h, path)
    return path


async def test_owners_from_the_api_and_the_report_in_a_directory_and_the_configmap(sim, exported, tmp_path):
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    out = tmp_path / "reports"
    code, _, err = await run(
        "--from",
        str(exported),
        "--kubeconfig",
        str(kubeconfig),
        "--output-dir",
        str(out),
        "--configmap",
        "gpuscale/gpuscale-report",
    )
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    kinds = {(w["kind"], w["name"], w["owner_source"]) for w in report["workloads"]}
    # the pod that still exists gets its Deployment; the one gone stays a bare pod, and the gaps say so
    assert kinds == {("Deployment", "trainer", "kubernetes"), ("Pod", "gone-pod", "none")}
    assert any("ml/gone-pod" in g for g in report["gaps"])
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "report.html",
            "report.json",
            "report.md",
            *(f"report-{report_stamp(report)}.{e}" for e in ("html", "json", "md")),
        ]
    )
    cm = sim.get("v1", "ConfigMap", "gpuscale-report", namespace="gpuscale")
    assert json.loads(cm["data"]["report.json"])["workloads"] == report["workloads"]
    assert cm["data"]["report.md"].startswith("# GPU right-sizing report")


def report_stamp(report) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(report["window"]["end"], UTC).strftime("%Y%m%dT%H%MZ")


async def test_a_missing_configmap_is_one_line_saying_what_to_do(sim, exported, tmp_path):
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    code, _, err = await run("--from", str(exported), "--kubeconfig", str(kubeconfig), "--configmap", "gpuscale/nope")
    assert code == 2
    assert err.strip() == (
        "gpuscale report: --configmap gpuscale/nope: HTTP 404 Not Found (create it first: deploy/report creates an "
        "empty one)"
    )


def test_the_cronjob_runs_flags_the_command_has_and_its_role_is_least_privilege():
    """deploy/report as rendered: every flag the CronJob passes exists; the base needs no API; with the
    ConfigMap the Role grants `patch` on one name and nothing else."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    import yaml

    from gpuscale.cli.main import _parser

    deploy = Path(__file__).resolve().parents[2] / "deploy" / "report"
    env = {**os.environ, "KUBECONFIG": "/dev/null"}

    def render(name):
        done = subprocess.run(
            [shutil.which("kubectl"), "kustomize", str(deploy / name)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        return [d for d in yaml.safe_load_all(done.stdout) if d]

    _, commands = _parser()
    known = {opt for action in commands["report"]._actions for opt in action.option_strings}
    for name in ("base", "with-configmap"):
        objs = render(name)
        (cron,) = [o for o in objs if o["kind"] == "CronJob"]
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"] == ["gpuscale", "report"]
        assert {a.split("=")[0] for a in container["args"]} <= known
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        roles = [o for o in objs if o["kind"] in ("Role", "ClusterRole", "ClusterRoleBinding")]
        if name == "base":
            assert pod["automountServiceAccountToken"] is False and not roles
        else:
            (role,) = roles
            assert role["rules"] == [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": ["gpuscale-report"],
                    "verbs": ["patch"],
                }
            ]
            assert "--configmap=gpuscale/gpuscale-report" in container["args"]
