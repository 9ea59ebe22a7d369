"""Memory of the adapter and its answer decoder process under label-set churn (issue 32, item 8), for the chart's limit.

The fleet and the fake Prometheus are bench_demand.py's (10,000 GPUs, every DCGM field and a vLLM rate, all labels
kept, ``instance``/``job`` added); the fake runs in a child process. ``gpuscale adapter`` runs as shipped (decoder
process on, plain HTTP on loopback, no Kubernetes API, so every refresh fetches the whole fleet: the
``--no-demand-driven`` worst case) at a 5 s refresh interval, and its resident memory and its decoder child's are read
from /proc every 0.5 s. The plateau is the largest sum of the two over the second half of the run (after 12 refreshes
the decoder's label-set tables have reached their steady size: KEEP_GENERATIONS).

Cases:

* fleet — the 10,000 GPUs as they are, every refresh the same label sets;
* churn — the same, and every answer carries ``--churn`` (20,000) more series whose label sets no answer had before
  (new pods every time): the hostile trial's shape, which plateaued near 626 + 568 MB before the cap;
* churn, decoded in a thread — ``--no-prometheus-decode-process`` (``--cases churn-thread``): the cap alone, per
  refresh;
* churn, no cap — the peer: churn with ``--prometheus-max-label-sets`` out of reach (10**9), the decoder's tables
  kept only by their generation sweep, as before the cap.

Each case runs ``--rounds`` times; the median and the rounds' spread are printed, with the series the cap left out
(``gpuscale_source_dropped_series``) and the refreshes done.

Usage: .venv/bin/python benchmarks/bench_label_churn.py [--seconds 120] [--rounds 2] [--churn 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_adapter_peers import process  # noqa: E402
from bench_demand import DCGM_FIELDS, EMPTY, RATE_SERIES, fleet  # noqa: E402
from bench_refresh import serve_instant_queries  # noqa: E402

from tests.ports import free_port  # noqa: E402

GPUS = 10_000
MB = 1024 * 1024


def _fake_prometheus(gpus: int, churn: int, queue: mp.Queue) -> None:  # the child process
    """Every DCGM field and the rate: the fleet's series, then ``churn`` series with label sets never sent before."""
    labels = fleet(gpus)
    known = {*DCGM_FIELDS, RATE_SERIES}
    fixed: dict[str, str] = {}
    answers = [0]

    def series(name: str) -> str:
        if name not in fixed:  # NB: the fleet's part, made once (its making is not what is measured)
            metric = {} if name == RATE_SERIES else {"__name__": name}
            fixed[name] = ",".join(
                json.dumps({"metric": {**metric, **gpu}, "value": [0, "1"]}).replace("[0,", "[TIME,") for gpu in labels
            )
        return fixed[name]

    def answer(promql: str) -> bytes:
        name = next((n for n in known if n in promql), None)
        if name is None:
            return EMPTY
        answers[0] += 1
        extra = [
            f'{{"metric":{{"namespace":"churn","pod":"c{answers[0]}-{i}","job":"x"}},"value":[TIME,"2"]}}'
            for i in range(churn)
        ]
        result = ",".join([series(name), *extra]).replace("[TIME,", f"[{time.time():.3f},")
        return b'{"status":"success","data":{"resultType":"vector","result":[' + result.encode() + b"]}}"

    serve_instant_queries(answer, queue)


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (the decoder is started from the adapter's Prometheus I/O thread)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # NB: a thread that ended meanwhile
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def scraped(url: str) -> dict[str, float]:
    """The adapter's /metrics lines that matter here: refreshes done and series left out."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {"refreshes": 0.0, "dropped": 0.0}
    for line in text.splitlines():
        if line.startswith("gpuscale_refresh_duration_seconds_count"):
            out["refreshes"] = float(line.split()[-1])
        elif line.startswith("gpuscale_source_dropped_series_total"):
            out["dropped"] += float(line.split()[-1])
    return out


def run_case(prometheus: str, extra: list[str], seconds: float, interval: float, work: Path) -> dict[str, float]:
    port = free_port()
    command = [sys.executable, "-m", "gpuscale.cli.main", "adapter", "--prometheus-url", prometheus,
               "--insecure-port", str(port), "--refresh-interval", f"{interval:g}s",
               "--prometheus-timeout", f"{interval:g}s",
               "--log-level", "warning", *extra]  # fmt: skip
    log = work / "adapter.log"
    base = f"http://127.0.0.1:{port}"
    samples: list[tuple[float, int, int]] = []  # (time, adapter, decoder)
    # NB: PYTHONPATH: this checkout's gpuscale, not an installed one
    with process(command, log, cwd=work, env={**os.environ, "PYTHONPATH": str(REPO)}) as popen:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if popen.poll() is not None:
                raise SystemExit(f"adapter exited:\n{log.read_text()[-3000:]}")
            kids = children(popen.pid)
            samples.append((time.monotonic() - started, rss_bytes(popen.pid), sum(rss_bytes(k) for k in kids)))
            time.sleep(0.5)  # NB: a sampling period, not a wait for readiness
        metrics = scraped(base)
    problems = [line for line in log.read_text().splitlines() if "prometheus" in line]
    if problems:
        print(f"adapter log: {problems[-1][:300]}", file=sys.stderr)
    late = [s for s in samples if s[0] >= seconds / 2]
    return {
        "plateau_mb": max(a + d for _, a, d in late) / MB,
        "adapter_mb": max(a for _, a, _ in late) / MB,
        "decoder_mb": max(d for _, _, d in late) / MB,
        "first_half_mb": max(a + d for t, a, d in samples if t < seconds / 2) / MB,
        **metrics,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="length of each run (default 120)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval", type=float, default=5.0, help="--refresh-interval, s (default 5, as shipped)")
    parser.add_argument("--churn", type=int, default=20_000, help="new label sets per answer (default 20,000)")
    parser.add_argument("--cases", default="fleet,churn,churn-nocap")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    servers: dict[int, str] = {}
    procs = []
    for churn in sorted({0 if c == "fleet" else args.churn for c in args.cases.split(",")}):
        ports: mp.Queue = ctx.Queue()
        server = ctx.Process(target=_fake_prometheus, args=(GPUS, churn, ports), daemon=True)
        server.start()
        procs.append(server)
        servers[churn] = f"http://127.0.0.1:{ports.get(timeout=600)}"
    cases = {
        "fleet": ("10,000 GPUs", servers.get(0), []),
        "churn": (f"+{args.churn:,} new sets/answer", servers.get(args.churn), []),
        "churn-thread": (f"+{args.churn:,}, decoded in a thread", servers.get(args.churn),
                         ["--no-prometheus-decode-process"]),
        "churn-nocap": (f"+{args.churn:,}, no cap (peer)", servers.get(args.churn), ["--prometheus-max-label-sets",
                                                                                      "1000000000"]),
    }  # fmt: skip
    load = os.getloadavg()[0]
    rows: dict[str, list[dict[str, float]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="gpuscale-label-churn-") as tmp:
            for round_ in range(args.rounds):
                for case in args.cases.split(","):
                    _, url, extra = cases[case]
                    assert url is not None
                    row = run_case(url, extra, args.seconds, args.interval, Path(tmp))
                    rows.setdefault(case, []).append(row)
                    print(json.dumps({"case": case, "round": round_, **row}), file=sys.stderr, flush=True)
    finally:
        for server in procs:
            server.terminate()
    print(f"{GPUS:,} GPUs, every query answered (no Kubernetes API: full refresh), refresh every {args.interval:g} s, "
          f"{args.seconds:g} s per run, {args.rounds} round(s); load {load:.2f} at the start")  # fmt: skip
    print(f"{'case':<34}{'plateau MB':>11}{'(rounds)':>18}{'adapter':>9}{'decoder':>9}{'refreshes':>10}"
          f"{'dropped':>12}")  # fmt: skip
    for case, runs in rows.items():
        plateau = statistics.median(r["plateau_mb"] for r in runs)
        spread = ", ".join(f"{r['plateau_mb']:.0f}" for r in runs)
        print(f"{cases[case][0]:<34}{plateau:>11.0f}{'[' + spread + ']':>18}"
              f"{statistics.median(r['adapter_mb'] for r in runs):>9.0f}"
              f"{statistics.median(r['decoder_mb'] for r in runs):>9.0f}"
              f"{statistics.median(r['refreshes'] for r in runs):>10.0f}"
              f"{statistics.median(r['dropped'] for r in runs):>12,.0f}")  # fmt: skip
    if "churn" in rows and "churn-nocap" in rows:
        capped = statistics.median(r["plateau_mb"] for r in rows["churn"])
        peer = statistics.median(r["plateau_mb"] for r in rows["churn-nocap"])
        print(f"churn plateau with the cap / without: {capped:.0f} / {peer:.0f} MB = {capped / peer:.2f}x")


if __name__ == "__main__":
    main()
