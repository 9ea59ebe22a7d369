"""`gpuscale report` against a hostile Prometheus and hostile ``--from`` files (issue 32, item 5).

Every input runs the real command line (tests/hostile/limits.run_cli: a child process under a 2 GiB address-space
cap and 30 s). Each either ends with exit 2 and one line on stderr that says what to do, or succeeds with the bad
points dropped and counted and out-of-range values kept out of every figure (lower_bound ≤ upper_bound, both
within the field's physical range) — never a traceback, a hang or an out-of-memory kill.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from gpuscale.metrics.history import History, Owner, PodRef
from gpuscale.sources.history_file import export_history
from tests.hostile.limits import DEFAULT_CAP_BYTES, Outcome, assert_refused_cleanly, run_cli

START = 1_780_000_000.0 // 3600 * 3600
HOURS = 6
END = START + HOURS * 3600
STEPS = HOURS * 60
HINT = "use --mode summary, a shorter --window or a coarser --step"
LABELS = {"Hostname": "node-a", "gpu": "0", "modelName": "NVIDIA H100 80GB HBM3", "pod": "llm-0", "namespace": "ml"}

Series = Callable[[str, np.ndarray], list[Any]]  # (DCGM field name, the query's step times) → result


@dataclass
class Prometheus:
    """What the fake answers: ``series`` for range queries of a field, or ``range_body`` as the raw body of every
    range query; ``count`` for the pre-flight's ``count by (__name__)``; ``instant`` by query prefix."""

    series: Series = lambda name, times: []
    range_body: bytes | None = None
    range_status: int = 200
    count: dict[str, int] = field(default_factory=dict)
    instant: dict[str, list[Any]] = field(default_factory=dict)
    stream_bytes: int = 0

    async def range_query(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        query = str(form["query"])
        if self.stream_bytes:
            return await self._stream(request)
        if self.range_body is not None:
            return web.Response(body=self.range_body, status=self.range_status, content_type="application/json")
        start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
        times = np.arange(start, end + step / 2, step)
        result = [] if query.startswith("count_over_time") else self.series(query.partition("{")[0], times)
        return _success({"resultType": "matrix", "result": result})

    async def instant_query(self, request: web.Request) -> web.Response:
        query = str((await request.post())["query"])
        if query.startswith("count by (__name__)"):
            result = [{"metric": {"__name__": n}, "value": [END, str(c)]} for n, c in self.count.items()]
            return _success({"resultType": "vector", "result": result})
        found = next((r for prefix, r in self.instant.items() if prefix in query), [])
        return _success({"resultType": "vector", "result": found})

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"status":"success","data":{"resultType":"matrix","result":[')
        chunk = b'{"metric":{},"values":[[1,"1"]]},' * (1 << 15)
        try:
            for _ in range(self.stream_bytes // len(chunk)):
                await response.write(chunk)
        except ConnectionError:
            pass  # the client hung up at its --max-response-size: what this input checks
        return response

    async def hostnames(self, request: web.Request) -> web.Response:
        return _success([])  # NB: no Hostname label: one batch, the whole fleet in one answer

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/label/Hostname/values", self.hostnames)
        app.router.add_post("/api/v1/query_range", self.range_query)
        app.router.add_post("/api/v1/query", self.instant_query)
        return app


def _success(data: Any) -> web.Response:
    return web.json_response({"status": "success", "data": data})


@pytest.fixture
def serve() -> Iterator[Callable[[Prometheus], str]]:
    """Starts a fake on loopback in a thread of its own (the CLI runs in a child process); yields its URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners: list[web.AppRunner] = []

    def start(fake: Prometheus) -> str:
        async def up() -> int:
            runner = web.AppRunner(fake.app())
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()  # NB: the kernel's port, bound by the server itself
            runners.append(runner)
            return runner.addresses[0][1]

        return f"http://127.0.0.1:{asyncio.run_coroutine_threadsafe(up(), loop).result(10)}"

    yield start
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


TRIED: list[tuple[str, Outcome]] = []


@pytest.fixture(scope="module", autouse=True)
def tally() -> Iterator[None]:
    yield
    if TRIED:
        worst = max(TRIED, key=lambda t: t[1].peak_rss_bytes)
        slowest = max(TRIED, key=lambda t: t[1].seconds)
        print(
            f"\nhostile report inputs: {len(TRIED)} tried; worst peak RSS {worst[1].peak_rss_bytes / 2**20:.0f} MiB "
            f"({worst[0]}); slowest {slowest[1].seconds:.1f} s ({slowest[0]})"
        )


def report(name: str, *argv: str) -> Outcome:
    outcome = run_cli(["report", *argv], seconds=30, cap_bytes=DEFAULT_CAP_BYTES)
    TRIED.append((name, outcome))
    assert not outcome.hung, f"{name}: hung; {outcome.stderr[-1000:]}"
    assert not outcome.traceback, f"{name}: {outcome.stderr[-3000:]}"
    return outcome


def fetch(url: str, *extra: str) -> list[str]:
    return ["--prometheus-url", url, "--end", f"{END:.0f}", "--window", f"{HOURS}h", "--step", "1m", *extra]


def one_gpu(values: Callable[[str, np.ndarray], list[Any] | None]) -> Series:
    """A fleet of one GPU whose points for each field are ``values(name, times)`` (None: not reported)."""

    def series(name: str, times: np.ndarray) -> list[Any]:
        points = values(name, times)
        return [] if points is None else [{"metric": {"__name__": name, "UUID": "GPU-0", **LABELS}, "values": points}]

    return series


def steady(name: str, times: np.ndarray) -> list[Any] | None:
    level = {"DCGM_FI_DEV_GPU_UTIL": "40", "DCGM_FI_PROF_SM_ACTIVE": "0.4", "DCGM_FI_DEV_FB_USED": "20000"}
    return [[float(t), level[name]] for t in times] if name in level else None


# --- the grid: refused before it is allocated ---------------------------------------------------------------------


def many_series(count: int) -> Series:
    """``count`` GPUs with one sample each (a broken relabelling: a series per scrape)."""

    def series(name: str, times: np.ndarray) -> list[Any]:
        if name != "DCGM_FI_DEV_GPU_UTIL":
            return []
        return [
            {"metric": {"UUID": f"GPU-{i}", "Hostname": f"n{i}", "pod": f"p{i}", "namespace": "ml"},
             "values": [[float(times[0]), "50"]]}
            for i in range(count)
        ]  # fmt: skip

    return series


@pytest.mark.parametrize("counted", [True, False], ids=["counted-before-fetching", "found-in-the-first-answer"])
def test_50000_series_over_a_week_are_refused_before_the_grid_is_allocated(serve, counted):
    fake = Prometheus(series=many_series(50_000), count={"DCGM_FI_DEV_GPU_UTIL": 50_000} if counted else {})
    url = serve(fake)
    out = report("50k series", "--prometheus-url", url, "--end", f"{END:.0f}", "--window", "168h")
    assert_refused_cleanly(out, says=HINT)
    assert "--memory-budget 1.5 GiB" in out.stderr and "10,080 steps" in out.stderr
    assert out.peak_rss_bytes < 1024**3, out.peak_rss_bytes  # main took 20.5 GB here


def test_a_smaller_budget_refuses_what_the_default_takes(serve):
    url = serve(Prometheus(series=many_series(1000)))
    assert report("1000 series", *fetch(url, "--window", "168h", "-o", "json")).code == 0
    out = report("1000 series, 64 MiB budget", *fetch(url, "--window", "168h", "--memory-budget", str(64 << 20)))
    assert_refused_cleanly(out, says="over --memory-budget 64 MiB")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--window", "100000d"], "--window: 2400000h is longer than a report covers (at most 366d)"),
        (["--window", "1e400"], "--window: '1e400' is not a finite duration"),
        (["--window", "nan"], "--window"),
        (["--window=-1h"], "--window"),
        (["--step", "1ms"], "--step: 0.001s is finer than DCGM samples (at least 1s)"),
        (["--step", "8d", "--window", "7d"], "--step: longer than --window"),
        (["--end", "1e20"], "--end: 1e+20 is not a time between 1970 and 2286"),
        (["--memory-budget", "1"], "--memory-budget"),
    ],
    ids=["100000d", "1e400", "nan", "negative", "1ms", "step>window", "end-far", "budget-tiny"],
)
def test_windows_and_steps_are_bounded_before_any_query(argv, says):
    out = report(f"flags {argv}", "--prometheus-url", "http://127.0.0.1:9", *argv)  # NB: port 9: nothing is asked
    assert_refused_cleanly(out, says=says)


# --- malformed answers: bad points dropped and counted, or the answer refused naming the query --------------------


def with_bad_points(name: str, times: np.ndarray) -> list[Any] | None:
    points = steady(name, times)
    if points is None or name != "DCGM_FI_DEV_GPU_UTIL":
        return points
    t = float(times[10])
    bad = [["x", "1"], [t, "abc"], [t, 5], [t, True], [t], "point", {"t": t}, [True, "1"], [t, None], [t, ["1"]]]
    # 10 malformed, a duplicate of step 10 and a rewind to step 3: 12 dropped; "NaN"/"+Inf" are no samples
    return points[:11] + bad + [[t, "41"], [float(times[3]), "42"]] + [[float(times[11]), "NaN"]] + points[12:]


def test_bad_points_in_an_answer_are_dropped_and_counted(serve):
    url = serve(Prometheus(series=one_gpu(with_bad_points)))
    out = report("bad points", *fetch(url, "-o", "json"))
    assert out.code == 0, out.stderr
    doc = json.loads(out.stdout)
    (gap,) = [g for g in doc["gaps"] if g.startswith("malformed answers")]
    assert "0 series without a label map" in gap and "12 point(s) not a [timestamp" in gap, gap
    (w,) = doc["workloads"]
    assert w["signals"]["gpu_util_percent"]["samples"] == STEPS - 1  # the NaN step is no sample; the rest count


def test_series_that_are_no_series_are_dropped_and_counted(serve):
    def series(name: str, times: np.ndarray) -> list[Any]:
        good = one_gpu(steady)(name, times)
        junk = ["series", {"metric": "x", "values": []}, {"metric": {}, "values": "abc"}, 7, None]
        return [*good, *junk] if good else []

    out = report("bad series", *fetch(serve(Prometheus(series=series)), "-o", "json"))
    assert out.code == 0, out.stderr
    gaps = json.loads(out.stdout)["gaps"]
    assert any("15 series without a label map" in g for g in gaps), gaps  # 5 in each of 3 fields' answers


@pytest.mark.parametrize(
    "value",
    ["1e308", "1e400", "-1e400", "NaN", "+Inf", "-Inf", "nan", "1.5e14"],
)
def test_huge_and_non_finite_values_are_no_samples(serve, value):
    def values(name: str, times: np.ndarray) -> list[Any] | None:
        points = steady(name, times)
        return None if points is None else [[t, value] if i % 2 else [t, v] for i, (t, v) in enumerate(points)]

    out = report(f"value {value}", *fetch(serve(Prometheus(series=one_gpu(values))), "-o", "json"))
    assert out.code == 0, out.stderr
    (w,) = json.loads(out.stdout)["workloads"]
    assert w["signals"]["gpu_util_percent"]["samples"] == STEPS // 2
    assert w["signals"]["gpu_util_percent"]["max"] == 40


@pytest.mark.parametrize(
    "body, status, says",
    [
        (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{', 200, "is not JSON (cut short?)"),
        (b"", 200, "is not JSON"),
        (b'{"status":"error","errorType":"bad_data","error":"parse error at char 9"}', 400, "parse error at char 9"),
        (b'{"status":"error","errorType":"internal","error":"boom"}', 200, "boom"),
        (b'{"status":"success","data":[]}', 200, "the answer has no result list"),
        (b'{"status":"success","data":{"result":{}}}', 200, "the answer has no result list"),
        (b'{"status":"success","data":{"result":"x"}}', 200, "the answer has no result list"),
        (b'["status", "success"]', 200, "refused: HTTP 200"),
        (b'{"status":"success","data":null}', 200, "the answer has no result list"),
    ],
    ids=["truncated", "empty", "error-400", "error-200", "data-list", "result-dict", "result-str", "array", "null"],
)
def test_an_answer_that_is_not_one_is_refused_in_one_line_naming_the_query(serve, body, status, says):
    url = serve(Prometheus(range_body=body, range_status=status))
    out = report(f"answer {body[:30]!r}", *fetch(url, "--retries", "0"))
    assert_refused_cleanly(out, says=says)
    assert "DCGM_FI_" in out.stderr  # the query is named


def test_a_300_mb_answer_is_refused_at_the_response_limit(serve):
    out = report("300 MB answer", *fetch(serve(Prometheus(stream_bytes=300 << 20)), "--retries", "0"))
    assert_refused_cleanly(out, says="larger than 128 MiB (--max-response-size)")
    assert out.peak_rss_bytes < 1024**3, out.peak_rss_bytes


def test_hostile_identity_answers_are_ignored(serve):
    junk = [
        "x",
        {"metric": "x", "value": [END, "1"]},
        {"metric": {"namespace": "ml", "pod": "llm-0", "owner_kind": 7}, "value": "abc"},
        {"metric": {"namespace": "ml", "pod": "llm-0"}, "value": [END, "abc"]},
        {"metric": {"namespace": "ml", "pod": "llm-0"}, "value": [END, "1e300"]},
        {"metric": {"namespace": "ml", "pod": "llm-0"}, "value": [END]},
    ]
    prefixes = ["kube_pod_owner", "kube_replicaset_owner", "kube_job_owner", "resource_requests", "kube_node_labels"]
    fake = Prometheus(series=one_gpu(steady), instant={p: junk for p in [*prefixes, "ready_time", "max(count"]})
    out = report("identity junk", *fetch(serve(fake), "-o", "json"))
    assert out.code == 0, out.stderr
    (w,) = json.loads(out.stdout)["workloads"]
    assert w["requests_source"] == "observed"  # no junk value was taken for a request


# --- physically impossible values: flagged, kept out of every figure, shown in every format -----------------------


def impossible(name: str, times: np.ndarray) -> list[Any] | None:
    """Half the steps valid; the other half utilisation 150 %, SM activity 150 (15,000 %), FB used -5 MiB."""
    points = steady(name, times)
    wrong = {"DCGM_FI_DEV_GPU_UTIL": "150", "DCGM_FI_PROF_SM_ACTIVE": "150", "DCGM_FI_DEV_FB_USED": "-5"}
    return None if points is None else [[t, wrong[name]] if i % 2 else [t, v] for i, (t, v) in enumerate(points)]


def test_out_of_range_values_are_counted_and_kept_out_of_percentiles(serve, tmp_path):
    url = serve(Prometheus(series=one_gpu(impossible)))
    out = report("impossible values json", *fetch(url, "-o", "json"))
    assert out.code == 0, out.stderr
    doc = json.loads(out.stdout)
    flagged = {r["field"]: (r["count"], r["lowest_seen"], r["highest_seen"]) for r in doc["out_of_range"]}
    assert flagged == {
        "gpu_util_percent": (STEPS // 2, 150, 150),
        "sm_active": (STEPS // 2, 150, 150),
        "fb_used_mib": (STEPS // 2, -5, -5),
    }
    (w,) = doc["workloads"]
    for name, s in w["signals"].items():
        top = 100 if s["unit"] == "percent" else 81559 if s["unit"] == "mib" else 64  # H100 80GB: policies/gpus
        assert 0 <= s["lower_bound"] <= s["upper_bound"] <= top, (name, s)
        assert 0 <= s["p50"] <= s["p95"] <= s["max"] <= top, (name, s)
    assert w["signals"]["gpu_util_percent"]["max"] == 40 and w["signals"]["sm_active_percent"]["max"] == 40
    assert w["signals"]["gpu_util_percent"]["samples"] == STEPS // 2

    table = report("impossible values table", *fetch(url))
    assert table.code == 0
    assert "180 value(s) of sm_active outside its physical range 0–1 ratio" in " ".join(table.stdout.split())
    report("impossible values files", *fetch(url, "--output-dir", str(tmp_path)))
    for ext in ("md", "html", "json"):
        text = (tmp_path / f"report.{ext}").read_text()
        text = "\n".join(json.loads(text)["gaps"]) if ext == "json" else text
        assert "value(s) of gpu_util_percent outside its physical range 0–100" in text, ext


# --- hostile --from files -----------------------------------------------------------------------------------------


def exported(tmp_path: Path, *, gpus: int = 2, steps: int = 120) -> Path:
    h = History(start=START, step_seconds=60.0, steps=steps, source="test")
    for g in range(gpus):
        gpu = h.new_gpu(f"GPU-{g}", node="node-a", product="NVIDIA H100 80GB HBM3")
        ref = PodRef("ml", f"p{g}")
        gpu.pod[:] = h.pod_index(ref)
        h.owners[ref] = Owner("Deployment", "app")
        gpu.values["sm_active"] = np.full(steps, 0.3, np.float32)
        gpu.values["gpu_util_percent"] = np.full(steps, 50.0, np.float32)
    path = tmp_path / "good.npz"
    export_history(h, path)
    return path


def rewritten(tmp_path: Path, name: str, change: Callable[[dict[str, Any], dict[str, Any]], None]) -> Path:
    """The exported file with its arrays and metadata changed by ``change(arrays, meta)``."""
    with np.load(exported(tmp_path)) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["meta"]))
    original = arrays["meta"]
    change(arrays, meta)
    if arrays["meta"] is original:  # NB: unless the change replaced meta itself, it changed the dict
        arrays["meta"] = np.array(json.dumps(meta))
    path = tmp_path / f"{name}.npz"
    np.savez(path, **arrays)
    return path


def _header(descr: str, shape: tuple[int, ...]) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


def declared(tmp_path: Path, *, gpus: int, steps: int) -> Path:
    """A consistent file whose headers declare ``gpus`` × ``steps`` arrays and which carries none of their data:
    at 100,000 × 100,000,000 the arrays would be 80 TB; the file is a few MB."""
    meta = {
        "format": "gpuscale.history/v1", "start": START, "step_seconds": 60.0, "steps": steps, "source": "x",
        "gaps": [], "gpus": [{"key": f"GPU-{i}", "node": "n"} for i in range(gpus)], "fields": ["sm_active"],
        "pods": [], "owners": [], "requests": [], "node_pools": {},
    }  # fmt: skip
    encoded = io.BytesIO()
    np.lib.format.write_array(encoded, np.array(json.dumps(meta)))
    members = {"meta.npy": encoded.getvalue(), "pod.npy": _header("<i4", (gpus, steps))}
    members["sm_active.npy"] = _header("<f4", (gpus, steps))
    return _zip(tmp_path / "declared.npz", members)


def _set(key: str, value: Any) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    return lambda arrays, meta: meta.__setitem__(key, value)


def _array(key: str, value: Any) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    return lambda arrays, meta: arrays.__setitem__(key, value)


BAD_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "not a zip": (lambda d: _write(d / "x.npz", b"\x80\x04pickle"), "not an .npz archive"),
    "empty zip": (lambda d: _zip(d / "e.npz", {}), "no meta array"),
    "meta not json": (lambda d: rewritten(d, "nj", _array("meta", np.array("{not json"))), "not a gpuscale history"),
    "meta a list": (lambda d: rewritten(d, "ml", _array("meta", np.array("[1, 2]"))), "format 'list'"),
    "wrong format": (lambda d: rewritten(d, "wf", _set("format", "v0")), "format 'v0'"),
    "steps a string": (lambda d: rewritten(d, "ss", _set("steps", "x")), "meta.steps"),
    "start NaN": (lambda d: rewritten(d, "sn", _set("start", float("nan"))), "meta.start"),
    "start in 3e10": (lambda d: rewritten(d, "sf", _set("start", 3e10)), "meta.start"),
    "step zero": (lambda d: rewritten(d, "sz", _set("step_seconds", 0)), "meta.step_seconds"),
    "gpus wrong type": (lambda d: rewritten(d, "gw", _set("gpus", [{"key": 7}])), "meta.gpus.0.key"),
    "field named meta": (lambda d: rewritten(d, "fm", _set("fields", ["meta"])), "meta.fields.0"),
    "owners short": (lambda d: rewritten(d, "os", _set("owners", [["ml", "p0"]])), "meta.owners.0"),
    "requests NaN": (lambda d: rewritten(d, "rn", _set("requests", [["ml", "p0", float("nan")]])), "meta.requests"),
    "pod floats": (lambda d: rewritten(d, "pf", _array("pod", np.zeros((2, 120)))), "pod is float64"),
    "field ints": (lambda d: rewritten(d, "fi", _array("sm_active", np.zeros((2, 120), int))), "sm_active is int64"),
    "field strings": (lambda d: rewritten(d, "fs", _array("sm_active", np.full((2, 120), "x"))), "sm_active is <U1"),
    "field 1-d": (lambda d: rewritten(d, "f1", _array("sm_active", np.zeros(240, np.float32))), "sm_active is"),
    "shape mismatch": (lambda d: rewritten(d, "sm", _set("steps", 121)), "does not match the metadata"),
    "80 TB declared": (lambda d: declared(d, gpus=100_000, steps=100_000_000), "over --memory-budget 1.5 GiB"),
    "data cut short": (lambda d: declared(d, gpus=2, steps=120), "not a gpuscale history file"),
    "one long GPU": (lambda d: exported(d, gpus=1, steps=20_000_000), "over --memory-budget 1.5 GiB"),
    "huge meta": (lambda d: rewritten(d, "hm", _array("meta", np.array("x" * (17 << 20)))), "at most 16 MiB"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_hostile_history_file_is_refused_in_one_line(tmp_path, case):
    make, says = BAD_FILES[case]
    path = make(tmp_path)
    out = report(f"--from {case}", "--from", str(path))
    assert_refused_cleanly(out, says=says)
    assert str(path) in out.stderr


def test_nan_inf_unknown_pods_and_impossible_values_in_a_file_are_counted(tmp_path):
    def change(arrays: dict[str, Any], meta: dict[str, Any]) -> None:
        sm = arrays["sm_active"].copy()
        sm[0, :30], sm[0, 30:40], sm[0, 40:50], sm[1, :20] = np.nan, np.inf, -np.inf, 150.0
        arrays["sm_active"] = sm
        pod = arrays["pod"].copy()
        pod[1, 100:] = 99  # no such pod
        arrays["pod"] = pod

    path = rewritten(tmp_path, "mixed", change)
    out = report("--from mixed", "--from", str(path), "-o", "json")
    assert out.code == 0, out.stderr
    doc = json.loads(out.stdout)
    assert any("20 step(s)" in g and "not in meta.pods" in g for g in doc["gaps"]), doc["gaps"]
    assert {r["field"]: r["count"] for r in doc["out_of_range"]} == {"sm_active": 20}
    (w,) = doc["workloads"]
    assert w["signals"]["sm_active_percent"]["max"] == 30
    assert w["signals"]["sm_active_percent"]["samples"] == (120 - 50) + (100 - 20)
