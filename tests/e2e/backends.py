"""The real Prometheus and VictoriaMetrics, started for end-to-end tests on 127.0.0.1.

Each backend runs as a child process with a free port, its own temporary storage and a scrape config
that the test writes (usually static targets: the simulated exporters on loopback). Nothing here
sleeps for a fixed time: starting waits on the server's own health endpoint, then on its
``/api/v1/targets`` (every target ``up``), then on a first sample being queryable; every wait has a
deadline and a failure quotes the tail of the backend's log. Teardown stops the process by PID:
SIGTERM, wait, SIGKILL after a timeout. On Linux the child also gets SIGKILL if the test process dies.

Measured on the CI machine (Prometheus 2.42, VictoriaMetrics 1.79): Prometheus answers ``/-/ready``
at once but applies static targets only after its discovery manager's 5 s batching delay, so the
first samples appear ~6 s after start; VictoriaMetrics scrapes within 1 s but makes new series
queryable only ~10 s later, and by default delays instant queries near "now" by 30 s
(``-search.latencyOffset``) unless the query says ``nocache=1`` (``Backend.query`` does).

Use from a test::

    async with Backends(tmp_path) as backends:
        prom = await backends.prometheus([static_job("sim", targets)])
        vm = await backends.victoria_metrics([static_job("sim", targets)])
        await asyncio.gather(prom.wait_ready(targets=len(targets)), vm.wait_ready(targets=len(targets)))

or the ``backends`` fixture (function scope). The exporters a backend scrapes must keep being served
while it waits, so every wait is async.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
import pytest
import yaml

from tests.ports import free_port

PROMETHEUS = shutil.which("prometheus")
VICTORIA_METRICS = shutil.which("victoria-metrics")

Kind = Literal["prometheus", "victoria-metrics"]


def require(binary: str | None, name: str) -> str:
    """The binary's path; a missing one is a broken setup (``bash .ci/setup --test``), not a skip."""
    if binary is None:
        raise RuntimeError(f"{name} is required for the end-to-end tests (run: bash .ci/setup --test)")
    return binary


# --- scrape configs -------------------------------------------------------------------------------------


def host_port(url: str) -> str:
    """``http://127.0.0.1:9400/metrics`` → ``127.0.0.1:9400`` (a static target)."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def static_job(
    job: str,
    targets: Iterable[str] | Mapping[str, Mapping[str, str]],
    *,
    scrape_interval: str = "1s",
    honor_labels: bool = False,
) -> dict[str, Any]:
    """One ``scrape_configs`` entry. ``targets`` are ``host:port`` or URLs; a mapping gives each target
    its own target labels (e.g. ``pod``/``namespace`` the way a ServiceMonitor's relabelling sets them)."""
    labelled = dict(targets) if isinstance(targets, Mapping) else {t: {} for t in targets}
    groups = [
        {"targets": [host_port(t) if "://" in t else t], **({"labels": dict(labels)} if labels else {})}
        for t, labels in labelled.items()
    ]
    return {
        "job_name": job,
        "scrape_interval": scrape_interval,
        "scrape_timeout": scrape_interval,
        "honor_labels": honor_labels,
        "static_configs": groups,
    }


def pod_target_labels(objects: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """``podIP:containerPort`` → ``{namespace, pod, container}`` for every pod port, as kubernetes_sd plus
    the usual ServiceMonitor relabelling would label the target (the exporter's labels of the same name
    then become ``exported_*`` unless ``honor_labels``)."""
    out: dict[str, dict[str, str]] = {}
    for obj in objects:
        if obj.get("kind") != "Pod":
            continue
        ip = (obj.get("status") or {}).get("podIP")
        for container in (obj.get("spec") or {}).get("containers", []):
            for port in container.get("ports", []):
                if ip and port.get("containerPort"):
                    out[f"{ip}:{port['containerPort']}"] = {
                        "namespace": obj["metadata"]["namespace"],
                        "pod": obj["metadata"]["name"],
                        "container": container["name"],
                    }
    return out


# --- a running backend ----------------------------------------------------------------------------------


class BackendError(RuntimeError):
    """A backend did not start, died, or did not become ready in time; the message quotes its log."""


@dataclass
class Backend:
    kind: Kind
    url: str
    process: subprocess.Popen[bytes]
    workdir: Path
    log_path: Path
    config_path: Path
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"

    def _fail(self, message: str) -> BackendError:
        return BackendError(f"{self.kind} (pid {self.pid}, {self.url}): {message}\n--- log tail ---\n{self.log_tail()}")

    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            raise self._fail(f"exited with status {self.process.returncode}")

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        return self._session

    async def get_json(self, path: str) -> Any:
        session = await self._http()
        async with session.get(self.url + path) as resp:
            return await resp.json(content_type=None)

    async def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query (POST, ``nocache=1``); the result list, or BackendError with the server's reason."""
        session = await self._http()
        async with session.post(f"{self.url}/api/v1/query", data={"query": promql, "nocache": "1"}) as resp:
            body = await resp.json(content_type=None)
        if body.get("status") != "success":
            raise self._fail(f"query {promql!r} failed: {body.get('errorType')}: {body.get('error')}")
        result = body["data"]["result"]
        return result if isinstance(result, list) else [{"metric": {}, "value": result}]

    async def scalar(self, promql: str) -> float | None:
        """The single value of an aggregating query, or None when it has no result yet."""
        result = await self.query(promql)
        return float(result[0]["value"][1]) if result else None

    async def targets(self) -> list[dict[str, Any]]:
        body = await self.get_json("/api/v1/targets")
        return list(body["data"]["activeTargets"])

    async def wait_until(
        self, check: Callable[[], Any], *, what: str, timeout: float = 30.0, interval: float = 0.2
    ) -> Any:
        """Poll the async ``check`` until it returns a truthy value; BackendError naming ``what`` on timeout."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            self._check_alive()
            try:
                last = await check()
                if last:
                    return last
            except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as e:
                last = e
            if time.monotonic() > deadline:
                raise self._fail(f"timed out after {timeout:.1f}s waiting for {what} (last: {last!r})")
            await asyncio.sleep(interval)

    async def wait_ready(self, *, targets: int, series: str = "up", timeout: float = 30.0) -> None:
        """Serving, all ``targets`` scraped and ``up``, and ``series`` queryable for each of them."""

        async def health() -> bool:
            path = "/-/ready" if self.kind == "prometheus" else "/health"
            session = await self._http()
            async with session.get(self.url + path) as resp:
                return resp.status == 200

        async def all_up() -> bool:
            active = await self.targets()
            return len(active) >= targets and all(t.get("health") == "up" for t in active)

        async def queryable() -> bool:
            return len({r["metric"].get("instance") for r in await self.query(series)}) >= targets

        deadline = time.monotonic() + timeout
        await self.wait_until(health, what="its health endpoint", timeout=timeout)
        await self.wait_until(all_up, what=f"{targets} targets up", timeout=max(1.0, deadline - time.monotonic()))
        await self.wait_until(
            queryable, what=f"{series!r} from {targets} targets", timeout=max(1.0, deadline - time.monotonic())
        )

    async def wait_scraped_after(self, moment: float, *, timeout: float = 15.0) -> None:
        """Every target's newest sample was scraped after ``moment`` (epoch seconds).

        ``up`` carries the scrape's start time, so the exporters rendered those samples after ``moment``.
        """

        async def newer() -> bool:
            oldest = await self.scalar("min(timestamp(up))")
            return oldest is not None and oldest > moment

        await self.wait_until(newer, what=f"a scrape of every target after {moment:.3f}", timeout=timeout)

    def pause(self, *, timeout: float = 5.0) -> None:
        """SIGSTOP: the server accepts connections but answers nothing (a hung Prometheus).

        Returns once every thread is stopped: the signal is delivered asynchronously, and a busy machine
        lets a Go server answer a request or two after ``kill`` returned.
        """
        os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while not self._stopped():
            if time.monotonic() > deadline:
                raise self._fail(f"not stopped {timeout:g}s after SIGSTOP")
            time.sleep(0.005)

    def _stopped(self) -> bool:
        tasks = Path(f"/proc/{self.pid}/task")
        if not tasks.is_dir():  # NB: no procfs: trust the signal
            return True
        states = []
        for task in tasks.iterdir():
            with contextlib.suppress(OSError):
                # "pid (comm) S ...": the state follows the last ')' (comm may contain spaces).
                states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
        return bool(states) and all(state in ("T", "t") for state in states)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    async def close_session(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def stop(self, *, timeout: float = 10.0) -> int:
        """Stop the process by PID: SIGCONT (if paused), SIGTERM, wait, SIGKILL after ``timeout``."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        return self.process.returncode


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphan backends if pytest is killed


def _spawn(kind: Kind, args: Sequence[str], *, url: str, workdir: Path, config_path: Path) -> Backend:
    log_path = workdir / f"{kind}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            # NB: prctl only (no locks touched); and the parent is the thread that forks, so call this
            # from the event loop's thread, never from a worker thread that may exit first.
            preexec_fn=_die_with_parent,
        )
    return Backend(kind, url, process, workdir, log_path, config_path)


def _write_config(
    workdir: Path,
    scrape_configs: Sequence[Mapping[str, Any]],
    scrape_interval: str,
    external_labels: Mapping[str, str] | None = None,
) -> Path:
    config = {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            **({"external_labels": dict(external_labels)} if external_labels else {}),
        },
        "scrape_configs": [dict(c) for c in scrape_configs],
    }
    path = workdir / "scrape.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _prometheus_command(config: Path, port: int, data: Path) -> list[str]:
    return [
        require(PROMETHEUS, "prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


def _victoria_metrics_command(config: Path, port: int, data: Path) -> list[str]:
    # NB: -search.latencyOffset stays at its default (30 s) on purpose: clients must send nocache=1.
    return [
        require(VICTORIA_METRICS, "victoria-metrics"),
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-storageDataPath={data}",
        f"-promscrape.config={config}",
        "-promscrape.config.strictParse=false",
        "-retentionPeriod=1d",
    ]


COMMANDS: dict[Kind, Callable[[Path, int, Path], list[str]]] = {
    "prometheus": _prometheus_command,
    "victoria-metrics": _victoria_metrics_command,
}


def start_backend(
    kind: Kind,
    scrape_configs: Sequence[Mapping[str, Any]],
    *,
    workdir: Path,
    scrape_interval: str = "1s",
    extra_args: Sequence[str] = (),
    external_labels: Mapping[str, str] | None = None,
) -> Backend:
    """Start Prometheus or single-node VictoriaMetrics (its built-in scraper) scraping ``scrape_configs``,
    on a free port with storage under ``workdir``. Not yet ready: ``await backend.wait_ready(targets=N)``.
    ``external_labels``: Prometheus' global ones (a Thanos sidecar adds them to every series it serves)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = _write_config(workdir, scrape_configs, scrape_interval, external_labels)
    port = free_port()
    args = [*COMMANDS[kind](config, port, workdir / "data"), *extra_args]
    return _spawn(kind, args, url=f"http://127.0.0.1:{port}", workdir=workdir, config_path=config)


class Backends:
    """Starts backends under one directory and stops every one of them (by PID) on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Backend] = []

    async def __aenter__(self) -> Backends:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, kind: Kind, scrape_configs: Sequence[Mapping[str, Any]], **kw: Any) -> Backend:
        """``start_backend`` in a fresh subdirectory; stopped with the others on exit."""
        n = sum(1 for b in self.started if b.kind == kind)
        workdir = self.workdir / (kind if n == 0 else f"{kind}-{n}")
        backend = start_backend(kind, scrape_configs, workdir=workdir, **kw)
        self.started.append(backend)
        return backend

    async def prometheus(self, scrape_configs: Sequence[Mapping[str, Any]], **kw: Any) -> Backend:
        return await self.start("prometheus", scrape_configs, **kw)

    async def victoria_metrics(self, scrape_configs: Sequence[Mapping[str, Any]], **kw: Any) -> Backend:
        return await self.start("victoria-metrics", scrape_configs, **kw)

    async def stop(self) -> None:
        for backend in self.started:
            await backend.close_session()
        errors = []
        for backend in self.started:
            try:
                backend.stop()
            except Exception as e:  # NB: stop the others anyway; report at the end
                errors.append(e)
        self.started.clear()
        if errors:
            raise errors[0]


@pytest.fixture
async def backends(tmp_path):
    """A ``Backends`` under the test's tmp_path; every backend started through it is stopped at teardown."""
    async with Backends(tmp_path / "backends") as b:
        yield b
