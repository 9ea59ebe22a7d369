"""Fault injection with real processes (issue 13, item 3).

The adapter runs as a subprocess exactly as a user starts it; around it, faults are injected into real
processes and servers: the real Prometheus is SIGKILLed and restarted on the same port and storage; the
simulated Kubernetes API drops watches, answers 410/409/429/500 through its fault plan
(``SimKubeApi.fail_next``) and goes away for 12 s (its port closed); one exporter answers slower than
``--scrape-timeout``; the serving certificate is rotated under a loop of concurrent HTTPS requests.

Every wait polls with a deadline (no fixed sleep waits for readiness); the figures each test measured
(seconds until 503, until recovery, requests sent/failed) are printed (``pytest -s``) and attached to
the test report as ``user_properties``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import ssl
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml

from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.kubeapi import SimKubeApi
from tests.e2e.backends import Backends, _spawn, host_port, pod_target_labels, static_job
from tests.e2e.test_kubectl import free_port

pytestmark = pytest.mark.e2e

C2 = "/apis/custom.metrics.k8s.io/v1beta2"
NIM_UTIL = f"{C2}/namespaces/nim/pods/*/gpu_utilization"
TRITON = "app%3Dtriton-bert"
QUEUE = f"{C2}/namespaces/inference/pods/*/inference_queue_depth?labelSelector={TRITON}"
TIMEOUT = aiohttp.ClientTimeout(total=5)


# --- helpers ----------------------------------------------------------------------------------------


def catalogue_with(tmp_path: Path, **defaults: str) -> str:
    """The shipped catalogue with some ``defaults`` changed (e.g. a short max_age), as a --config file."""
    catalogue = yaml.safe_load(Path("policies/metrics.yaml").read_text())
    catalogue["defaults"].update(defaults)
    path = tmp_path / "metrics.yaml"
    path.write_text(yaml.safe_dump(catalogue))
    return str(path)


class Adapter:
    """`gpuscale adapter` as a subprocess; its stderr goes to a file (never a pipe nobody reads)."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    @classmethod
    async def start(cls, tmp_path: Path, *args: str, scheme: str = "http") -> Adapter:
        port = free_port()
        log = tmp_path / "adapter.log"
        port_flag = "--insecure-port" if scheme == "http" else "--secure-port"
        command = [sys.executable, "-m", "gpuscale.cli.main", "adapter", port_flag, str(port)]
        command += ["--bind-address", "127.0.0.1", "--log-level", "warning", *args]
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(*command, stderr=err)
        return cls(proc, f"{scheme}://127.0.0.1:{port}", log)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def check_alive(self) -> None:
        assert self.proc.returncode is None, f"adapter exited {self.proc.returncode}:\n{self.log_tail()}"

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def get(session: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    """(status, body as JSON or text, headers)."""
    async with session.get(url, **kw) as resp:
        text = await resp.text()
        try:
            body: Any = json.loads(text)
        except ValueError:
            body = text
        return resp.status, body, resp.headers


async def poll(
    check: Callable[[], Awaitable[Any]], *, what: str, timeout: float, interval: float = 0.2, alive: Adapter | None
) -> Any:
    """Call ``check`` until it returns something truthy; fail naming ``what`` (and the last value) on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        if alive is not None:
            alive.check_alive()
        try:
            last = await check()
            if last:
                return last
        except (aiohttp.ClientError, TimeoutError) as e:
            last = e
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}; last: {last!r}"
        await asyncio.sleep(interval)


def timestamps(body: dict[str, Any]) -> dict[str, str]:
    """describedObject name → the item's timestamp (RFC 3339, whole seconds)."""
    return {i["describedObject"]["name"]: i["timestamp"] for i in body["items"]}


def epoch(rfc3339: str) -> float:
    return time.mktime(time.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone


def report(request: pytest.FixtureRequest, **figures: Any) -> None:
    for key, value in figures.items():
        request.node.user_properties.append((key, value))
    print(f"\n{request.node.name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


# --- the simulated API's fault plan, over HTTP --------------------------------------------------------


async def test_sim_fault_plan_answers_as_kube_apiserver_does():
    async with SimKubeApi() as api, aiohttp.ClientSession(timeout=TIMEOUT) as session:
        pods = f"{api.url}/api/v1/pods"
        api.fail_next(429, retry_after_seconds=3)
        api.fail_next(500, times=2)
        api.fail_next(409, verb="list", resource="deployments.apps")
        api.fail_next(410, verb="watch", resource="pods")
        status, body, headers = await get(session, pods)
        assert (status, body["reason"], headers["Retry-After"]) == (429, "TooManyRequests", "3")
        assert body["kind"] == "Status" and body["details"]["retryAfterSeconds"] == 3
        for _ in range(2):
            status, body, _ = await get(session, pods)
            assert (status, body["reason"]) == (500, "InternalError")
            assert body["message"] == "Internal error occurred: etcdserver: leader changed"
        assert (await get(session, pods))[0] == 200  # the plan for pods lists is used up
        status, body, _ = await get(session, f"{api.url}/apis/apps/v1/deployments")
        assert (status, body["reason"], body["details"]) == (409, "Conflict", {"kind": "deployments", "group": "apps"})
        # 410 on a watch is what the watch cache sends: HTTP 200 and one ERROR event with an Expired Status.
        async with session.get(f"{pods}?watch=1&resourceVersion={api.resource_version}") as resp:
            assert resp.status == 200
            events = [json.loads(line) for line in (await resp.read()).splitlines()]
        assert [e["type"] for e in events] == ["ERROR"]
        assert (events[0]["object"]["code"], events[0]["object"]["reason"]) == (410, "Expired")
        assert [(f.verb, f.resource, f.code) for f in api.faults_served] == [
            ("list", "pods", 429),
            ("list", "pods", 500),
            ("list", "pods", 500),
            ("list", "deployments.apps", 409),
            ("watch", "pods", 410),
        ]
        assert api.pending_faults == 0


async def test_sim_drops_watches_and_goes_away_on_the_same_port():
    async with SimKubeApi() as api, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        url = api.url
        async with session.get(f"{url}/api/v1/namespaces?watch=1&allowWatchBookmarks=true") as resp:
            assert (await resp.content.readline()).startswith(b'{"type":"ADDED"')
            await poll(lambda: asyncio.sleep(0, api.drop_watches()), what="a watch to drop", timeout=5, alive=None)
            with pytest.raises(aiohttp.ClientPayloadError):  # cut mid-stream: no final chunk, no BOOKMARK
                while await resp.content.readline():
                    pass
        await api.go_away()
        assert not api.available
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "made-while-away"}})
        with pytest.raises(aiohttp.ClientConnectorError):
            await get(session, f"{url}/api/v1/namespaces")
        assert await api.come_back() == url
        status, body, _ = await get(session, f"{url}/api/v1/namespaces/made-while-away")
        assert status == 200 and body["metadata"]["name"] == "made-while-away"


# --- 1. Prometheus killed and restarted ------------------------------------------------------------------


async def test_prometheus_killed_then_restarted(tmp_path, request):
    max_age, refresh = 5.0, 1.0
    async with SimCluster() as cluster, Backends(tmp_path / "backends") as backends:
        labels = pod_target_labels(cluster.exporters.kube_objects())
        prometheus = await backends.prometheus(
            [
                static_job("dcgm-exporter", {u: labels[host_port(u)] for u in cluster.exporters.dcgm_urls.values()}),
                static_job("triton", {u: labels[host_port(u)] for u in cluster.exporters.triton_urls.values()}),
            ]
        )
        await prometheus.wait_ready(targets=len(cluster.scrape_urls))
        adapter = await Adapter.start(
            tmp_path,
            "--prometheus-url",
            prometheus.url,
            "--kubeconfig",
            cluster.kubeconfig,
            "--refresh-interval",
            f"{refresh:g}s",
            "--config",
            catalogue_with(tmp_path, max_age=f"{max_age:g}s"),
        )
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:

                async def serving() -> Any:
                    status, body, _ = await get(session, adapter.url + NIM_UTIL)
                    return body if status == 200 and len(body["items"]) == 2 else None

                await poll(serving, what="the adapter to serve over Prometheus", timeout=40, alive=adapter)
                assert (await get(session, adapter.url + "/readyz"))[0] == 200

                # SIGKILL: no shutdown, no stale markers; the port is closed at once.
                os.kill(prometheus.pid, signal.SIGKILL)
                prometheus.process.wait(5)
                killed = time.time()
                served: list[tuple[float, int, Any, Any]] = []

                async def unavailable() -> Any:
                    status, body, headers = await get(session, adapter.url + NIM_UTIL)
                    served.append((time.time(), status, body, headers.get("Retry-After")))
                    return status == 503

                await poll(unavailable, what="503 after Prometheus died", timeout=max_age + 10, alive=adapter)
                first_503 = served[-1][0] - killed
                ok = [s for s in served if s[1] == 200]
                assert all(s[1] in (200, 503) for s in served), [s[:2] for s in served]
                # Until max-age the last good values were served, with their own (pre-kill) timestamps.
                assert all(epoch(t) <= killed + 1 for s in ok for t in timestamps(s[2]).values())
                last_good = max((epoch(t) for s in ok for t in timestamps(s[2]).values()), default=killed - refresh)
                assert first_503 <= max_age + 3 * refresh, f"503 only {first_503:.1f}s after the kill"
                assert served[-1][0] >= last_good + max_age - 1.5  # never 503 before the values were stale
                _, _, body, retry_after = served[-1]
                assert body["kind"] == "Status" and body["reason"] == "ServiceUnavailable" and int(retry_after) >= 1

                async def unready() -> Any:
                    status, text, _ = await get(session, adapter.url + "/readyz")
                    return text if status == 503 else None

                why = await poll(unready, what="/readyz to turn unready", timeout=max_age + 5, alive=adapter)
                unready_after = time.time() - killed
                assert host_port(prometheus.url) in why, why  # names the Prometheus target …
                assert any(w in why.lower() for w in ("refused", "connect", "unreachable", "error", "fail")), why

                # Restart on the same port with the same storage (and config).
                restarted = _spawn(
                    "prometheus",
                    list(prometheus.process.args),  # type: ignore[arg-type]
                    url=prometheus.url,
                    workdir=prometheus.workdir,
                    config_path=prometheus.config_path,
                )
                backends.started.append(restarted)
                restart_at = time.time()
                after_restart: list[tuple[float, int, Any]] = []

                async def recovered() -> Any:
                    status, body, _ = await get(session, adapter.url + NIM_UTIL)
                    after_restart.append((time.time(), status, body))
                    ready, _, _ = await get(session, adapter.url + "/readyz")
                    return status == 200 and ready == 200

                await poll(recovered, what="recovery after the restart", timeout=40, alive=adapter, interval=0.1)
                recovered_after = time.time() - restart_at
                first_200 = next(t for t, status, _ in after_restart if status == 200)
                # When did the restarted Prometheus first scrape? (up's timestamp is the scrape's start.)
                await restarted.wait_ready(targets=len(cluster.scrape_urls))
                first_scrape = await restarted.scalar("min(timestamp(up))")
                await restarted.close_session()
                report(
                    request,
                    seconds_until_503=round(first_503, 1),
                    seconds_until_unready=round(unready_after, 1),
                    seconds_restart_to_recovered=round(recovered_after, 1),
                    restarted_first_scrape_after_restart=round((first_scrape or 0) - restart_at, 1),
                    first_200_after_restart=round(first_200 - restart_at, 1),
                    readyz_while_down=why,
                )
                # A 200 is a claim that the value is younger than max-age. The restarted Prometheus answers
                # instant queries from its replayed WAL (5-minute lookback) before it has scraped anything:
                # a 200 then serves pre-kill samples, stamped with the evaluation time, as fresh.
                stale_claims = [
                    (
                        round(t - restart_at, 1),
                        sorted({round(epoch(ts) - restart_at) for ts in timestamps(body).values()}),
                    )
                    for t, status, body in after_restart
                    if status == 200 and (first_scrape is None or t < first_scrape) and t - killed > max_age
                ]
                assert not stale_claims, (
                    f"served 200 at +{stale_claims[0][0]}s after the restart with item timestamps at "
                    f"+{stale_claims[0][1]}s, before the restarted Prometheus scraped anything (first scrape at "
                    f"+{(first_scrape or 0) - restart_at:.1f}s): values sampled before the kill, at least "
                    f"{first_200 - killed:.1f}s old (> max-age {max_age:g}s), served as fresh"
                )
        finally:
            await adapter.stop()


# --- 2. the Kubernetes API misbehaves and goes away ---------------------------------------------------------


def api_triton_pods(cluster: SimCluster) -> set[str]:
    return {
        p["metadata"]["name"]
        for p in cluster.api.list("v1", "Pod", namespace="inference", label_selector="app=triton-bert")
    }


async def test_kubernetes_api_faults_and_an_outage(tmp_path, request):
    # NB: 12 s, not 30: long enough for the watch backoff to double four times (1, 2, 4, 8 s) and for pods to
    # change meanwhile, which is all the recovery path depends on; 30 s only made the suite 40 s slower.
    outage_seconds = 12.0
    async with SimCluster() as cluster:
        api = cluster.api
        adapter = await Adapter.start(
            tmp_path, "--kubeconfig", cluster.kubeconfig, "--discover-exporters", "--refresh-interval", "1s"
        )
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:

                async def served() -> list[str]:
                    status, body, _ = await get(session, adapter.url + QUEUE)
                    assert status == 200, (status, body)
                    return [i["describedObject"]["name"] for i in body["items"]]

                async def in_step() -> Any:
                    names = await served()
                    assert len(names) == len(set(names)), f"duplicated pods: {names}"
                    return set(names) == api_triton_pods(cluster)

                async def wait_in_step(what: str, timeout: float = 20) -> float:
                    started = time.monotonic()
                    await poll(in_step, what=what, timeout=timeout, alive=adapter)
                    return time.monotonic() - started

                await poll(
                    lambda: _status_is(session, adapter.url + QUEUE, 200), what="ready", timeout=30, alive=adapter
                )
                await wait_in_step("the first pods")

                # A background prober: every metrics request during the faults must be answered 200.
                statuses: list[int] = []
                stop = asyncio.Event()

                async def probe() -> None:
                    while not stop.is_set():
                        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                            statuses.append((await get(session, adapter.url + QUEUE))[0])
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), 0.25)

                prober = asyncio.create_task(probe())

                # (a) open watches cut mid-stream; a pod created right after must still arrive.
                assert await poll(lambda: asyncio.sleep(0, api.drop_watches()), what="watches", timeout=10, alive=None)
                await cluster.exporters.set_replicas("inference/triton-bert", 4)
                after_drop = await wait_in_step("a pod created after the watches were dropped")

                # (b) the re-opened watch gets 410 Expired, so the cache relists; the relist meets 409, 429, 500.
                for code in (409, 429, 500):
                    api.fail_next(code, verb="list", resource="pods")
                api.fail_next(410, verb="watch", resource="pods")
                api.drop_watches("pods")
                await poll(
                    lambda: asyncio.sleep(0, api.pending_faults == 0), what="faults served", timeout=20, alive=None
                )
                await cluster.exporters.set_replicas("inference/triton-bert", 3)
                after_errors = await wait_in_step("a pod deleted after 410/409/429/500")
                served_codes = [(f.verb, f.code) for f in api.faults_served]
                assert served_codes == [("watch", 410), ("list", 409), ("list", 429), ("list", 500)], served_codes

                # (c) the API goes away for 12 s; pods are deleted and created meanwhile.
                before = api_triton_pods(cluster)
                await api.go_away()
                gone_at = time.monotonic()
                await cluster.exporters.set_replicas("inference/triton-bert", 1)
                await cluster.exporters.set_replicas("inference/triton-bert", 4)
                during = api_triton_pods(cluster)
                assert len(before - during) == 2 and len(during - before) == 3  # 2 deleted, 3 created
                observations: list[tuple[float, int, str, str]] = []
                while time.monotonic() - gone_at < outage_seconds:
                    ready_status, ready_text, _ = await get(session, adapter.url + "/readyz")
                    _, metrics, _ = await get(session, adapter.url + "/metrics")
                    kube_lines = "\n".join(
                        line
                        for line in metrics.splitlines()
                        if not line.startswith("#") and ("kube" in line.lower() or "watch" in line.lower())
                    )
                    observations.append((time.monotonic() - gone_at, ready_status, ready_text, kube_lines))
                    await asyncio.sleep(min(2.0, max(0.0, outage_seconds - (time.monotonic() - gone_at))))
                still_served = set(await served())
                await api.come_back()
                back_at = time.monotonic()
                await wait_in_step("the pods changed during the outage", timeout=45)
                recovery = time.monotonic() - back_at
                stop.set()
                await prober
                failed = [s for s in statuses if s != 200]
                report(
                    request,
                    seconds_watch_drop_to_in_step=round(after_drop, 1),
                    seconds_410_409_429_500_to_in_step=round(after_errors, 1),
                    seconds_api_back_to_in_step=round(recovery, 1),
                    metric_requests=len(statuses),
                    metric_requests_failed=len(failed),
                    readyz_during_outage=sorted({(o[1], o[2]) for o in observations}),
                    kube_lines_in_metrics_during_outage=observations[-1][3] or "<none>",
                    served_at_end_of_outage=sorted(still_served),
                )
                assert not failed, f"{len(failed)} of {len(statuses)} metrics requests failed: {sorted(set(failed))}"
                assert still_served == before  # the cache kept serving what it knew
                assert all(o[1] == 200 for o in observations), observations  # serving from cache: still ready
                # It must say that it serves from a cache it cannot refresh: /readyz stays ok (right: the values
                # are fresh), so /metrics is where that shows (watch errors / last successful list per kind).
                assert any(
                    'gpuscale_source_target_up{source="kubernetes",target="pods"} 0.0' in o[3]
                    and "Kubernetes API not answering" in o[2]
                    for o in observations
                ), (
                    f"during a {outage_seconds:g} s Kubernetes API outage neither /readyz nor /metrics said anything about it: "
                    f"/readyz answered {sorted({(o[1], o[2]) for o in observations})} and /metrics had no "
                    "kube/watch series"
                )
        finally:
            await adapter.stop()


async def _status_is(session: aiohttp.ClientSession, url: str, code: int) -> bool:
    return (await get(session, url))[0] == code


# --- 3. one slow exporter ----------------------------------------------------------------------------------


async def test_a_slow_exporter_never_delays_the_others(tmp_path, request):
    refresh, scrape_timeout = 2.0, 1.0
    async with SimCluster() as cluster:
        triton = sorted(key for key in cluster.exporters.triton_urls if key[0] == "inference")
        slow = triton[0]
        adapter = await Adapter.start(
            tmp_path,
            "--kubeconfig",
            cluster.kubeconfig,
            "--refresh-interval",
            f"{refresh:g}s",
            "--scrape-timeout",
            f"{scrape_timeout:g}s",
            *(a for url in cluster.scrape_urls for a in ("--scrape-url", url)),
        )
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                path = adapter.url + f"{C2}/namespaces/inference/pods/*/inference_queue_depth"

                async def all_served() -> Any:
                    status, body, _ = await get(session, path)
                    return body if status == 200 and len(body["items"]) == len(triton) else None

                await poll(all_served, what="every inference pod", timeout=30, alive=adapter)

                async def watch_timestamps(seconds: float) -> dict[str, list[tuple[float, float]]]:
                    """pod → [(timestamp, seconds from it until an answer first carried it)], polled every 50 ms."""
                    seen: dict[str, list[tuple[float, float]]] = {}
                    until = time.time() + seconds
                    while time.time() < until:
                        status, body, _ = await get(session, path)
                        assert status == 200, body
                        now = time.time()
                        for name, stamp in timestamps(body).items():
                            stamps = seen.setdefault(name, [])
                            if not stamps or stamps[-1][0] != epoch(stamp):
                                stamps.append((epoch(stamp), now - epoch(stamp)))
                        await asyncio.sleep(0.05)
                    return seen

                def lags(seen: dict[str, list[tuple[float, float]]]) -> list[float]:
                    # NB: the first entry of each pod was already there when polling began: not a measured lag.
                    return sorted(lag for name, s in seen.items() if name != slow[1] for _, lag in s[1:])

                baseline = await watch_timestamps(3 * refresh + 0.5)
                cluster.exporters.set_faults(slow, delay_s=30.0)  # far beyond --scrape-timeout
                faulted = time.time()
                seen = await watch_timestamps(5 * refresh + 1)
                others = {name: [t for t, _ in stamps] for name, stamps in seen.items() if name != slow[1]}
                assert len(others) == len(triton) - 1, seen.keys()
                gaps = [b - a for stamps in others.values() for a, b in itertools.pairwise(stamps)]
                # Timestamps are whole seconds and refreshes keep their phase, so the truncation adds the same
                # fraction to every lag: the difference of the medians is the delay the slow exporter adds.
                lag_before, lag_during = statistics.median(lags(baseline)), statistics.median(lags(seen))
                report(
                    request,
                    refreshes_seen_per_pod={n: len(s) for n, s in others.items()},
                    max_gap_between_timestamps=max(gaps),
                    slow_pod_timestamps=[round(t - faulted, 1) for t, _ in seen.get(slow[1], [])],
                    median_publication_lag_before=round(lag_before, 2),
                    median_publication_lag_with_slow_exporter=round(lag_during, 2),
                )
                # Every refresh (every 2 s; timestamps are whole seconds) brought a newer timestamp for each other pod.
                assert all(len(stamps) >= 5 for stamps in others.values()), others
                assert max(gaps) <= refresh + 1.0, gaps
                # The refresh publishes once the answering targets are in, without waiting for the slow one's
                # --scrape-timeout (1 s here): the others' values come no later than without it (whole-second
                # timestamps: half a second of slack).
                assert lag_during - lag_before <= 0.5, (lag_before, lag_during)
                # … and the slow pod's value aged: its newest timestamp is from before the fault.
                assert seen[slow[1]][-1][0] <= faulted + 1
                _, metrics, _ = await get(session, adapter.url + "/metrics")
                slow_url = cluster.exporters.triton_urls[slow]
                up = [line for line in metrics.splitlines() if line.startswith("gpuscale_source_target_up{")]
                assert any(slow_url in line and line.endswith(" 0.0") for line in up), up
        finally:
            await adapter.stop()


# --- 4. serving certificate rotated under load ---------------------------------------------------------------

HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"


def write_pair(cert: trustme.LeafCert, cert_file: Path, key_file: Path) -> None:
    """As a Secret volume update lands: each file replaced atomically, the key first."""
    for blob, path in ((cert.private_key_pem, key_file), (cert.cert_chain_pems[0], cert_file)):
        tmp = path.with_suffix(".tmp")
        blob.write_to_path(tmp)
        os.replace(tmp, path)


async def peer_certificate(url: str, ctx: ssl.SSLContext) -> bytes:
    """The DER certificate a brand-new TLS connection is served."""
    host, port = host_port(url).split(":")
    reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx, server_hostname=host)
    try:
        return writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()
        assert reader is not None


async def test_serving_certificate_rotation_under_load_drops_no_request(tmp_path, request):
    old_ca, new_ca = trustme.CA(), trustme.CA()
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_pair(old_ca.issue_cert("127.0.0.1", "localhost"), cert_file, key_file)
    renewed = new_ca.issue_cert("127.0.0.1", "localhost")
    new_der = ssl.PEM_cert_to_DER_cert(renewed.cert_chain_pems[0].bytes().decode())
    client_ctx = ssl.create_default_context()
    old_ca.configure_trust(client_ctx)
    new_ca.configure_trust(client_ctx)  # a client trusting both: any failure is the adapter's
    async with SimCluster() as cluster:
        cluster.api.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
                "data": {},
            }
        )
        cluster.api.add_token("hpa-token", HPA_USER)
        cluster.api.allow(users=[HPA_USER], verbs=["get", "list"], api_groups=["custom.metrics.k8s.io"])
        adapter = await Adapter.start(
            tmp_path,
            "--kubeconfig",
            cluster.kubeconfig,
            "--discover-exporters",
            "--refresh-interval",
            "1s",
            "--tls-cert-file",
            str(cert_file),
            "--tls-private-key-file",
            str(key_file),
            "--tls-reload-interval",
            "200ms",
            scheme="https",
        )
        headers = {"Authorization": "Bearer hpa-token"}
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT, headers=headers) as session:

                async def serving() -> Any:
                    status, body, _ = await get(session, adapter.url + NIM_UTIL, ssl=client_ctx)
                    return status == 200 and len(body["items"]) == 2

                await poll(serving, what="the secure adapter", timeout=30, alive=adapter)
                sent = 0
                failures: list[str] = []
                new_conn_certs: list[bytes] = []
                stop = asyncio.Event()

                async def worker(fresh_connections: bool) -> None:
                    nonlocal sent
                    connector = aiohttp.TCPConnector(force_close=fresh_connections, ssl=client_ctx)
                    async with aiohttp.ClientSession(timeout=TIMEOUT, headers=headers, connector=connector) as s:
                        while not stop.is_set():
                            sent += 1
                            try:
                                status, body, _ = await get(s, adapter.url + NIM_UTIL)
                                if status != 200 or len(body["items"]) != 2:
                                    failures.append(f"{status}: {str(body)[:200]}")
                            except (aiohttp.ClientError, TimeoutError, ssl.SSLError) as e:
                                failures.append(f"{type(e).__name__}: {e}")
                            await asyncio.sleep(0)

                workers = [asyncio.create_task(worker(fresh_connections=i % 2 == 0)) for i in range(6)]
                await poll(lambda: asyncio.sleep(0, sent > 50), what="load", timeout=10, alive=adapter)
                sent_before = sent
                write_pair(renewed, cert_file, key_file)
                rotated = time.monotonic()

                async def new_cert_served() -> bool:
                    der = await peer_certificate(adapter.url, client_ctx)
                    new_conn_certs.append(der)
                    return der == new_der

                await poll(new_cert_served, what="the renewed certificate", timeout=10, alive=adapter, interval=0.05)
                switched = time.monotonic() - rotated
                at_switch = sent
                await poll(lambda: asyncio.sleep(0, sent > at_switch + 100), what="load after", timeout=20, alive=None)
                stop.set()
                await asyncio.gather(*workers)
                # Every new connection from now on gets the renewed certificate.
                later = [await peer_certificate(adapter.url, client_ctx) for _ in range(5)]
                report(
                    request,
                    requests_sent=sent,
                    requests_sent_during_rotation=sent - sent_before,
                    requests_failed=len(failures),
                    seconds_until_new_certificate=round(switched, 2),
                )
                assert not failures, f"{len(failures)} of {sent} requests failed: {sorted(set(failures))[:5]}"
                assert all(der == new_der for der in later)
        finally:
            await adapter.stop()
