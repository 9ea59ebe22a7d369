"""deploy/dashboards: every panel's queries, run against a real Prometheus loaded with the test fleet.

The fleet (tests/operating/fleet.py: the shipped exporter scrapes, gpuscale's own registries, kube-state-metrics)
is backfilled as TSDB blocks with promtool, and the two recording rules the dashboards read are backfilled from it
with `promtool tsdb create-blocks-from rules`, as an operator's Prometheus would have recorded them. Then, for every
dashboard: each query (template variables at "All", $__range = the loaded hour) parses and returns data over the
last hour, names only metrics the fleet exposes or a recording rule of deploy/alerts, and each template
variable's query lists values. Failures are collected so one run names every broken panel.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import aiohttp
import yaml

from tests.e2e.backends import Backends
from tests.operating.prometheus import RECORDING, api, load_fleet

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "dashboards").glob("*.json"))
END = (int(time.time()) // 60) * 60 - 600
HOUR = 3600
VARIABLES = {"$cluster": ".*", "$namespace": ".*", "$pool": ".*", "$node": ".*", "$model": ".*", "$job": ".*"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr.replace("$__range", "1h")


def expand(regex: str) -> set[str]:
    """The names a regex of literals, alternations and groups matches: ``A_(B|C)_D|E`` → {A_B_D, A_C_D, E}."""
    alternatives, depth, start = [], 0, 0
    for i, ch in enumerate(regex):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "|" and depth == 0:
            alternatives.append(regex[start:i])
            start = i + 1
    alternatives.append(regex[start:])
    out = set()
    for alt in alternatives:
        m = re.search(r"\(([^()]*)\)", alt)
        if m is None:
            assert re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", alt), f"not a plain name: {alt!r}"
            out.add(alt)
        else:
            for choice in m.group(1).split("|"):
                out |= expand(alt[: m.start()] + choice + alt[m.end() :])
    return out


def _finite(result: dict) -> bool:
    values = result.get("values") or [result["value"]]
    return any(math.isfinite(float(v)) for _, v in values)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (selectors and __name__ regex alternatives)."""
    names = set()
    for regex in re.findall(r'__name__=~"([^"]+)"', expr):
        names |= expand(regex)
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    bare = re.sub(r"\b\d+(\.\d+)?([eE][+-]?\d+)?\b", " ", bare)
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\()?", bare):
        if not m.group(2) and m.group(1) not in KEYWORDS:
            names.add(m.group(1))
    return names


async def test_every_panel_parses_reads_only_exposed_metrics_and_has_data(tmp_path):
    async with Backends(tmp_path / "backends") as backends, aiohttp.ClientSession() as session:
        prom, series = await load_fleet(backends, session, tmp_path, end=END)
        exposed = {name for name, _, _ in series} | {
            r["record"] for g in yaml.safe_load(RECORDING.read_text())["groups"] for r in g["rules"]
        }

        problems, counts = [], {}
        for path in DASHBOARDS:
            board = json.loads(path.read_text())
            counts[path.stem] = len(panels(board))
            for p in panels(board):
                for target in p["targets"]:
                    expr = substitute(target["expr"])
                    where = f"{path.name} panel {p['id']} {p['title']!r} {target['refId']}"
                    unknown = metric_names(expr) - exposed
                    if unknown:
                        problems.append(f"{where}: reads metrics nobody exposes: {sorted(unknown)}")
                    try:
                        if target.get("instant"):
                            data = await api(session, prom.url, "/api/v1/query", query=expr, time=str(END))
                        else:
                            data = await api(
                                session,
                                prom.url,
                                "/api/v1/query_range",
                                query=expr,
                                start=str(END - HOUR),
                                end=str(END),
                                step="60",
                            )
                    except AssertionError as e:
                        problems.append(f"{where}: {e}")
                        continue
                    if not any(_finite(r) for r in data["result"]):
                        problems.append(f"{where}: no data (or only NaN)")
            for v in board["templating"]["list"]:
                if v["type"] != "query":
                    continue
                query = substitute(v["query"])
                if m := re.fullmatch(r"label_values\((.*), (\w+)\)", query, re.S):
                    query = f"count by ({m.group(2)}) ({m.group(1)})"
                elif m := re.fullmatch(r"query_result\((.*)\)", query, re.S):
                    query = m.group(1)
                data = await api(session, prom.url, "/api/v1/query", query=query, time=str(END))
                if not data["result"]:
                    problems.append(f"{path.name} variable {v['name']}: no values")
        problems += await _counts_say_zero_when_nothing_matches(session, prom.url)
        print("panels per dashboard:", counts)
        assert len(counts) == 7 and all(counts.values())
        assert not problems, "\n".join(problems)


# Stat panels that count things which may simply be none yet: each must show 0 then, not "No data".
ZERO_WHEN_NONE = {
    ("cost.json", "Idle GPUs (controller)"),
    ("cost.json", "Allocated GPUs"),
    ("cost.json", "Allocated GPUs idle now"),
    ("fleet.json", "Allocated"),
    ("fleet.json", "Active (SM > 10 %)"),
}


async def _counts_say_zero_when_nothing_matches(session: aiohttp.ClientSession, url: str) -> list[str]:
    """Every stat panel with an ``or vector(0)`` fallback answers one sample: the count over the fleet at END, and 0
    three hours before, where the Prometheus holds no series at all (the fleet starts two hours before END). One
    sample both times proves the fallback matches the aggregation's grouping (a grouped count would add a stray 0)."""
    problems, seen = [], set()
    for path in DASHBOARDS:
        for p in panels(json.loads(path.read_text())):
            if p["type"] != "stat" or not p["targets"][0]["expr"].endswith("or vector(0)"):
                continue
            seen.add((path.name, p["title"]))
            expr = substitute(p["targets"][0]["expr"])
            for at, zero in ((END, False), (END - 3 * HOUR, True)):
                result = (await api(session, url, "/api/v1/query", query=expr, time=str(at)))["result"]
                values = [float(r["value"][1]) for r in result]
                if len(values) != 1 or (zero and values != [0.0]):
                    problems.append(
                        f"{path.name} panel {p['title']!r} at {at}: {values} (want one sample{', 0' if zero else ''})"
                    )
    missing = ZERO_WHEN_NONE - seen
    if missing:
        problems.append(f"count panels without a 0 fallback: {sorted(missing)}")
    return problems


def test_metric_names_finds_what_a_query_reads():
    assert metric_names('sum by (le, model) (rate(vllm:x_bucket{a="b{c}"}[5m])) / 1e6 > on (a) group_left (b) y') == {
        "vllm:x_bucket",
        "y",
    }
    assert metric_names('{__name__=~"DCGM_FI_PROF_(NVLINK|PCIE)_(TX|RX)_BYTES"}') == {
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    }
