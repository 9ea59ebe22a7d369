"""Running `gpuscale controller` as a process against the simulated cluster: the parts every e2e test shares."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from gpuscale.sim.exporters import SimExporters
from gpuscale.sim.kubeapi import SimKubeApi
from tests.controller.harness import scenario


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    """Poll ``check`` every 0.1 s until it is true; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


@asynccontextmanager
async def simulated_cluster(nodes: int) -> AsyncIterator[tuple[SimKubeApi, SimExporters]]:
    """A simulated API server holding ``nodes`` GPU nodes (pool gpu-a), and their dcgm-exporters."""
    api = SimKubeApi()
    await api.start()
    exporters = SimExporters()
    await exporters.start(scenario(nodes))
    for obj in exporters.kube_objects():
        if obj["kind"] in ("Node", "Namespace"):
            api.apply(obj)
    try:
        yield api, exporters
    finally:
        await exporters.stop()
        await api.stop()


def controller_command(kubeconfig: str, exporters: SimExporters, port: int, *extra: str) -> list[str]:
    """`gpuscale controller` scraping every simulated exporter, probes on 127.0.0.1:port, a 0.5 s interval."""
    return [
        sys.executable,
        "-m",
        "gpuscale.cli.main",
        "controller",
        "--kubeconfig",
        kubeconfig,
        *[arg for url in exporters.dcgm_urls.values() for arg in ("--scrape-url", url)],
        "--port",
        str(port),
        "--bind-address",
        "127.0.0.1",
        "--interval",
        "0.5s",
        *extra,
    ]


@asynccontextmanager
async def controller_process(command: list[str], stderr: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """The process, its stderr in ``stderr``; killed at the end if it is still running."""
    with open(stderr, "wb") as err:
        proc = await asyncio.create_subprocess_exec(*command, stderr=err)
        try:
            yield proc
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
