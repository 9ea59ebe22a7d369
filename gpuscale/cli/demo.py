"""`gpuscale demo`: a simulated GPU cluster, the adapter in front of it, what the HPA sees, and an HPA at work.

Starts the simulated Kubernetes API and exporters (gpuscale.sim), then the real adapter — the same
`start_adapter` the `adapter` command runs — pointed at them, prints `kubectl get --raw` commands to paste
and a table of what the metrics API answers. Then it replays a slice of a real LLM trace, sped up, as the
Triton Deployment's load, while an HPA loop built on gpuscale.hpa reads the adapter over HTTP as the
controller does and scales the Deployment through the API's scale subresource (demo_replay.py) and writes
the HPA object's status, so `kubectl get hpa` shows it; it writes an HTML summary of the first pass and,
unless --no-keep-running, replays the slice again and again until Ctrl-C, so the printed commands keep working
and the HPA keeps scaling with the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

from gpuscale.cli.adapter import start_adapter, wait_ready
from gpuscale.cli.demo_replay import DemoReplay
from gpuscale.model import format_quantity
from gpuscale.replay.chart import write_html
from gpuscale.settings import AdapterSettings, DemoSettings
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.exporters.llm import demo_llm_servers

_COLUMNS = [
    ("gpu_utilization", "GPU util %"),
    ("gpu_sm_active", "SM active %"),
    ("gpu_tensor_active", "tensor %"),
    ("gpu_dram_active", "DRAM %"),
    ("gpu_memory_used_bytes", "mem used"),
    ("gpu_power_watts", "power W"),
    ("inference_queue_depth", "queue"),
    ("inference_queue_compute_ratio", "queue:compute"),
]


def gpuscale_command() -> str:
    """How to run this gpuscale from a new terminal: the absolute path of the running executable, not a bare
    ``gpuscale`` that the new terminal's PATH may not find (a virtualenv that is not activated)."""
    argv0 = Path(sys.argv[0])
    if argv0.name in ("gpuscale", "kubectl-gpu") and argv0.is_file():
        sibling = argv0.absolute().with_name("gpuscale")
        if sibling.is_file():
            return shlex.quote(str(sibling))
    return shlex.join([sys.executable, "-m", "gpuscale"])


async def _pause(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless Ctrl-C comes first; True once it has (every wait of the start stays interruptible)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


async def _until_served(server: str, paths: list[str], stop: asyncio.Event, *, timeout_s: float = 60.0) -> list[str]:
    """Wait until every API path the demo prints answers with values, so a command pasted at once works: the
    adapter finds its exporters through the API as in a cluster, so its first refreshes can come before the
    first scrape of a pod; and rates need two scrapes. Returns the paths still not served at the deadline (none
    after Ctrl-C)."""
    deadline = time.monotonic() + timeout_s
    pending = list(paths)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while pending and time.monotonic() < deadline:
            waiting = []
            for path in pending:
                body = None
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with session.get(server + path) as resp:
                        body = await resp.json(content_type=None) if resp.status == 200 else None
                if not isinstance(body, dict) or body.get("items") == []:
                    waiting.append(path)
            pending = waiting
            if pending and await _pause(stop, 0.2):
                return []
    return pending


def _raw_paths(commands: list[tuple[str, str]]) -> list[str]:
    """The API paths of the printed ``kubectl get --raw`` commands."""
    return [shlex.split(cmd)[-1] for _, cmd in commands if " get --raw " in cmd]


def _commands(server: str, kubeconfig: str, top: str) -> list[tuple[str, str]]:
    raw = f"kubectl --server={server} get --raw"
    base = "/apis/custom.metrics.k8s.io/v1beta2"
    return [
        ("metric API groups and versions", f"kubectl --server={server} api-versions"),
        ("custom metrics on offer", f"kubectl --server={server} get --raw {base}"),
        (
            "GPU util of the Triton pods (what an HPA on app=triton-bert reads)",
            f"{raw} '{base}/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dtriton-bert'",
        ),
        (
            "…and how busy the SMs really are",
            f"{raw} '{base}/namespaces/inference/pods/*/gpu_sm_active?labelSelector=app%3Dtriton-bert'",
        ),
        (
            "queue:compute ratio of the Triton deployment (object metric)",
            f"{raw} '{base}/namespaces/inference/deployments.apps/triton-bert/inference_queue_compute_ratio'",
        ),
        (
            "the LLM server's util trap: GPU util reads 100 %…",
            f"{raw} '/apis/custom.metrics.k8s.io/v1beta1/namespaces/nim/pods/*/gpu_utilization'",
        ),
        (
            "…while its SMs are less than half busy",
            f"{raw} '/apis/custom.metrics.k8s.io/v1beta1/namespaces/nim/pods/*/gpu_sm_active'",
        ),
        (
            "…though its own metrics (NIM) show requests waiting with the KV cache a third full",
            f"{raw} '/apis/custom.metrics.k8s.io/v1beta1/namespaces/nim/pods/*/inference_kv_cache_usage'",
        ),
        (
            "the util trap side by side: GPU util, SM active, batch, KV cache, TTFT and the verdicts per pod",
            f"{top} -n nim --adapter-url {server}",
        ),
        ("power per node", f"{raw} '/apis/custom.metrics.k8s.io/v1beta1/nodes/*/gpu_power_watts'"),
        (
            "external: queue depth of one model",
            f"{raw} '/apis/external.metrics.k8s.io/v1beta1/namespaces/inference/inference_queue_depth"
            "?labelSelector=model%3Dbert_qa_onnx'",
        ),
        ("what each GPU pod is really doing (verdicts from the same API)", f"{top} -A --adapter-url {server}"),
        ("the simulated cluster itself", f"kubectl --kubeconfig={kubeconfig} get pods -A -o wide"),
        (
            "the demo's HPA: its targets and replicas as its loop last decided",
            f"kubectl --kubeconfig={kubeconfig} get hpa -n inference",
        ),
    ]


async def _table(session: aiohttp.ClientSession, server: str, namespaces: list[str]) -> Table:
    table = Table(title=f"What the HPA sees — {time.strftime('%H:%M:%S')}", header_style="bold")
    table.add_column("namespace/pod")
    for _, title in _COLUMNS:
        table.add_column(title, justify="right")
    rows: dict[str, dict[str, str]] = {}
    for ns in namespaces:
        for metric, _ in _COLUMNS:
            url = f"{server}/apis/custom.metrics.k8s.io/v1beta1/namespaces/{ns}/pods/*/{metric}"
            async with session.get(url) as resp:
                if resp.status != 200:
                    continue
                body = await resp.json()
            for item in body["items"]:
                rows.setdefault(f"{ns}/{item['describedObject']['name']}", {})[metric] = _human(metric, item["value"])
    for name in sorted(rows):
        table.add_row(name, *(rows[name].get(m, "–") for m, _ in _COLUMNS))
    return table


def _human(metric: str, quantity: str) -> str:
    from decimal import Decimal

    suffix = {"m": Decimal("0.001"), "k": Decimal(1000), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12)}
    q = quantity
    value = Decimal(q[:-1]) * suffix[q[-1]] if q[-1] in suffix else Decimal(q)
    if metric.endswith("_bytes"):
        return f"{float(value) / 2**30:.1f} GiB"
    return f"{float(value):.2f}" if metric.endswith("_ratio") else f"{float(value):.1f}"


async def run_demo(settings: DemoSettings, stop: asyncio.Event) -> None:
    """The demo in named steps: the simulated cluster, the adapter on it (``demo_adapter_settings``), the commands
    to paste (``print_commands``), one raw answer and the table (``print_first_answers``), then the replay with a
    summary after its first pass (``after_first_pass``)."""
    console = Console()
    if console.width < 150:  # NB: piped output defaults to 80 columns; the table needs ~150
        console = Console(width=150)
    out_dir = Path(tempfile.mkdtemp(prefix="gpuscale-demo-"))
    replay = DemoReplay.load(phase_s=settings.duration)
    config = settings.config
    if config is None and settings.policies is None:
        config = str(replay.catalogue_file(out_dir, refresh_s=settings.refresh_interval))
    # NB: a scaled-down pod serves on through its grace period (Kubernetes' default 30 s), as a real one does, so
    # the adapter's scrape round that listed it just before it left the API still gets an answer, not a failure.
    grace_s = max(30.0, 3 * settings.refresh_interval)
    async with SimCluster(llm=demo_llm_servers(), termination_grace_s=grace_s) as cluster:
        cluster.api.create(replay.manifest())  # NB: so `kubectl get hpa` shows it; its loop writes the status
        adapter = await start_adapter(
            demo_adapter_settings(settings, kubeconfig=cluster.kubeconfig, config=config),
            port_flags={"insecure": "--port"},
        )
        try:
            await wait_ready(adapter)
            # Rates need two scrapes; wait for the second refresh so the first table is complete (the adapter's
            # /readyz and log say why if refreshes keep failing; Ctrl-C works throughout).
            while adapter.pipeline.refreshes < 2:
                if await _pause(stop, 0.1):
                    return
            await print_commands(console, settings, adapter.url, cluster, stop)
            if stop.is_set():
                return
            namespaces = sorted({w.namespace for w in cluster.scenario.workloads})
            async with aiohttp.ClientSession() as session:
                await print_first_answers(console, session, adapter.url, namespaces)
                await replay.run(
                    cluster,
                    session=session,
                    adapter_url=adapter.url,
                    console=console,
                    stop=stop,
                    passes=None if settings.keep_running else 1,
                    on_pass=after_first_pass(
                        console,
                        session,
                        settings,
                        replay,
                        adapter_url=adapter.url,
                        namespaces=namespaces,
                        out_dir=out_dir,
                    ),
                )
        finally:
            await adapter.stop()


def demo_adapter_settings(settings: DemoSettings, *, kubeconfig: str, config: str | None) -> AdapterSettings:
    """The adapter as the `adapter` command would run it in the simulated cluster, on the demo's port."""
    return AdapterSettings(
        # NB: every exporter found through the API, as in a cluster, and no fixed --scrape-url: a fixed URL
        # of a Triton pod the HPA removes would be scraped on, failing (HTTP 404) for the rest of the demo.
        discover_exporters=True,
        kubeconfig=kubeconfig,
        insecure_port=settings.port,
        bind_address="127.0.0.1",
        refresh_interval=settings.refresh_interval,
        log_level=settings.log_level,
        config=config,
        policies=settings.policies,
    )


async def print_commands(
    console: Console, settings: DemoSettings, adapter_url: str, cluster: SimCluster, stop: asyncio.Event
) -> None:
    """The `kubectl get --raw` and `gpuscale top` commands to paste, once the adapter serves what they ask for."""
    top = f"{gpuscale_command()} top pods"
    if settings.policies:
        top += f" --policies {shlex.quote(str(Path(settings.policies).absolute()))}"
    commands = _commands(adapter_url, cluster.kubeconfig, top)
    for path in await _until_served(adapter_url, _raw_paths(commands), stop):
        console.print(f"[yellow]not served yet after 60 s (see the adapter's /readyz):[/] {path}")
    console.print(f"[bold]gpuscale adapter[/] serving the metrics APIs on {adapter_url}")
    console.print(f"simulated cluster: {len(cluster.scenario.nodes)} GPU nodes, kubeconfig {cluster.kubeconfig}")
    console.print("Paste these in another terminal to see exactly what the HPA sees:\n")
    for what, cmd in commands:
        console.print(f"  [dim]# {what}[/]\n  {cmd}", soft_wrap=True, highlight=False)
    console.print()


async def print_first_answers(
    console: Console, session: aiohttp.ClientSession, adapter_url: str, namespaces: list[str]
) -> None:
    """One raw response of the custom metrics API, then the table of what the HPA sees."""
    example = f"{adapter_url}/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization"
    async with session.get(example) as resp:
        console.print("[dim]# one raw response:[/]")
        console.print_json(json.dumps(await resp.json()))
    console.print(await _table(session, adapter_url, namespaces))


def after_first_pass(
    console: Console,
    session: aiohttp.ClientSession,
    settings: DemoSettings,
    replay: DemoReplay,
    *,
    adapter_url: str,
    namespaces: list[str],
    out_dir: Path,
) -> Callable[[int, dict], Awaitable[None]]:
    """What the replay awaits after each pass: after the first, the table again and the HTML summary in
    ``out_dir``."""

    async def after_pass(number: int, summary: dict) -> None:
        if number > 1:
            return  # NB: the summary and its page are the first pass's; later ones only scroll by
        console.print(await _table(session, adapter_url, namespaces))
        page = write_html(summary, out_dir / "summary.html")
        if replay.ready_after:
            console.print(
                f"New pods were counted ready {replay.startup_s:.0f} s after a scale-up (trace time: the "
                "next HPA sync; the simulated Deployment starts pods at once, real ones load their model "
                "first).",
                highlight=False,
            )
        console.print(f"HTML summary of the autoscaling replay written to {page}")
        if settings.keep_running:
            console.print(
                "\n[bold]Still serving[/]: the simulated cluster, the adapter and the HPA loop keep "
                "running, the trace slice replayed again and again, so every command above keeps working "
                "and `kubectl get hpa` follows the load. Ctrl-C to stop.\n",
                highlight=False,
            )

    return after_pass


__all__ = ["format_quantity", "run_demo"]
