"""deploy/alerts: the rule files and PrometheusRules as the real promtool sees them.

`promtool check rules` on every file; `promtool test rules` on the unit tests of deploy/alerts/tests (each alert fires
on its bad case with the labels that name the subject and stays quiet on the healthy neighbours beside it; a healthy
fleet fires nothing); the generated files are what deploy/generator writes; every alert carries a summary, a
description and a runbook section that exists in docs/operating.md; the Xid classes are policies/health.yaml's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.operating.enabled_counters import fill, parse_series, series_fields

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "alerts"
RULE_FILES = sorted(ALERTS.glob("*.rules.yaml"))
UNIT_TESTS = ALERTS / "tests"
PROMTOOL = shutil.which("promtool")
# The page the shipped runbook_urls point into: the chart's default for monitoring.prometheusRules.runbookBaseURL.
RUNBOOK_PAGE = yaml.safe_load((ROOT / "deploy" / "charts" / "gpuscale" / "values.yaml").read_text())["monitoring"][
    "prometheusRules"
]["runbookBaseURL"]
if PROMTOOL is None:  # NB: a missing promtool is a broken setup (bash .ci/setup --test), not a skip
    raise RuntimeError("promtool is required (run: bash .ci/setup --test)")


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


def alerts() -> dict[str, dict]:
    found = {}
    for f in RULE_FILES:
        for group in yaml.safe_load(f.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    found[rule["alert"]] = rule
    return found


def test_the_generated_files_are_up_to_date():
    done = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "generator" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_promtool_checks_the_rule_files():
    done = promtool("check", "rules", *map(str, RULE_FILES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_FILES)


def test_prometheusrules_carry_exactly_the_rule_files(tmp_path):
    for f in RULE_FILES:
        kind = f.name.removesuffix(".rules.yaml").removeprefix("gpuscale-")
        obj = yaml.safe_load((ALERTS / "prometheusrules" / f"{kind}.yaml").read_text())
        assert (obj["apiVersion"], obj["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
        assert obj["spec"] == yaml.safe_load(f.read_text())
        spec = tmp_path / f.name
        spec.write_text(yaml.safe_dump(obj["spec"]))
        done = promtool("check", "rules", str(spec))
        assert done.returncode == 0, done.stdout + done.stderr


def _with_every_enabled_counter(tmp_path: Path) -> Path:
    """deploy/alerts copied, each unit test's GPUs given every field deploy/dcgm-exporter enables (those a case does
    not set read healthy: tests/operating/enabled_counters.py), as a GPU Operator with that counters file serves."""
    copy = tmp_path / "alerts"
    shutil.copytree(ALERTS, copy)
    for f in (copy / "tests").glob("*.test.yaml"):
        doc = yaml.safe_load(f.read_text())
        doc["tests"] = [fill(case) for case in doc["tests"]]
        f.write_text(yaml.safe_dump(doc, width=1000))
    return copy


def _without_annotations(tmp_path: Path) -> Path:
    """deploy/alerts copied with annotations removed: promtool compares annotations exactly, so the per-alert cases
    test labels and timing, and annotations.test.yaml tests the texts on the files as shipped. Every enabled DCGM
    field is fed (_with_every_enabled_counter)."""
    copy = _with_every_enabled_counter(tmp_path)
    for f in copy.glob("*.rules.yaml"):
        doc = yaml.safe_load(f.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        f.write_text(yaml.safe_dump(doc))
    return copy


@pytest.mark.parametrize("name", ["hardware.test.yaml", "workloads.test.yaml"])
def test_each_alert_fires_on_its_bad_case_and_not_on_its_neighbours(tmp_path, name):
    copy = _without_annotations(tmp_path)
    done = promtool("test", "rules", str(copy / "tests" / name))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_page_texts_carry_the_numbers(tmp_path):
    copy = _with_every_enabled_counter(tmp_path)
    done = promtool("test", "rules", str(copy / "tests" / "annotations.test.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_healthy_fleet_fires_nothing(tmp_path):
    copy = _without_annotations(tmp_path)
    path = copy / "tests" / "healthy.test.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["tests"][0]["alert_rule_test"] = [
        {"eval_time": t, "alertname": name, "exp_alerts": []}
        for name in sorted(alerts())
        for t in ("30m", "60m", "119m")
    ]
    path.write_text(yaml.safe_dump(doc))
    done = promtool("test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_case_with_its_subject():
    fired: dict[str, list[dict]] = {}
    for f in ("hardware.test.yaml", "workloads.test.yaml"):
        for case in yaml.safe_load((UNIT_TESTS / f).read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                fired.setdefault(t["alertname"], []).extend(a["exp_labels"] for a in t["exp_alerts"])
    missing = sorted(name for name in alerts() if not fired.get(name))
    assert not missing, f"alerts without a unit test that fires them: {missing}"
    for name, expected in fired.items():
        for labels in expected:
            subject = set(labels) - {"severity"}
            assert subject & {
                "UUID",
                "pod",
                "training_job",
                "model",
                "model_name",
                "target",
                "horizontalpodautoscaler",
            }, f"{name}: fired without a label naming its subject: {labels}"


def anchors(page: Path) -> set[str]:
    """The fragments a Markdown renderer (GitHub's rule) gives the page's headings."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}


def test_every_alert_has_texts_a_runbook_and_a_for_that_tolerates_a_lost_scrape():
    for name, rule in alerts().items():
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        assert set(notes) == {"summary", "description", "runbook_url"}, f"{name}: {sorted(notes)}"
        # An absolute URL (Alertmanager and Grafana show it as a link), under the page a user sets, whose fragment
        # is a heading of the docs page it names.
        url = urlsplit(notes["runbook_url"])
        assert url.scheme == "https" and url.netloc, f"{name}: {notes['runbook_url']}"
        assert f"{url.scheme}://{url.netloc}{url.path}" == RUNBOOK_PAGE, name
        assert url.fragment == name.lower(), name
        page = ROOT / url.path.lstrip("/")
        assert url.fragment in anchors(page), f"{name}: no heading '#### {name}' in {page.relative_to(ROOT)}"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        # 1 m scrapes: an instant condition needs for ≥ 2m to ride out one lost scrape; a condition over a range
        # (increase, max_over_time…) does not depend on one scrape.
        minutes = int(rule["for"].removesuffix("m"))
        assert minutes >= 2 or re.search(r"\[\d+[mh]\]", rule["expr"]), f"{name}: for: {rule['for']}"


def test_the_documented_sed_points_the_plain_rule_files_at_your_page(tmp_path):
    """docs/operating.md's one-liner for rule_files: users rewrites every runbook_url's page and nothing else."""
    (script,) = re.findall(r"sed '(s\|runbook_url: [^']+)'", (ROOT / "docs" / "operating.md").read_text())
    page = script.split("|")[2].removeprefix("runbook_url: ").removesuffix("#")
    source = ALERTS / "gpuscale-alerts.rules.yaml"
    done = subprocess.run(["sed", script, str(source)], capture_output=True, text=True, timeout=30, check=True)
    copy = tmp_path / source.name
    copy.write_text(done.stdout)
    assert promtool("check", "rules", str(copy)).returncode == 0
    rewritten = [r for g in yaml.safe_load(done.stdout)["groups"] for r in g["rules"]]
    assert [r["annotations"]["runbook_url"] for r in rewritten] == [f"{page}#{r['alert'].lower()}" for r in rewritten]
    for rule in rewritten:
        rule["annotations"]["runbook_url"] = alerts()[rule["alert"]]["annotations"]["runbook_url"]
    assert rewritten == [r for g in yaml.safe_load(source.read_text())["groups"] for r in g["rules"]]


def test_xid_classes_are_policies_health():
    health = yaml.safe_load((ROOT / "policies" / "health.yaml").read_text())
    fatal = {x["code"] for x in health["xids"] if x["severity"] == "fatal"}
    expr = alerts()["GPUFatalXid"]["expr"]
    (codes,) = set(re.findall(r'xid=~"([0-9|]+)"', expr))
    assert {int(c) for c in codes.split("|")} == fatal
    assert {48, 64, 74, 79, 95} <= fatal


def test_every_dcgm_field_the_rules_and_dashboards_read_is_enabled_in_deploy():
    """deploy/dcgm-exporter/counters.csv switches on every DCGM field an alert, a rule or a panel reads."""
    from tests.deploy.test_deploy import COUNTERS, _enabled_counters
    from tests.operating.test_dashboards import metric_names

    exprs = [r["expr"] for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]
    for board in (ROOT / "deploy" / "dashboards").glob("*.json"):
        exprs += [t["expr"] for p in json.loads(board.read_text())["panels"] for t in p.get("targets", [])]
    read = {n for e in exprs for n in metric_names(e) if n.startswith("DCGM_")}
    assert {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_EXP_XID_ERRORS_COUNT"} <= read
    missing = read - _enabled_counters(COUNTERS.read_text()).keys()
    assert not missing, f"read but not enabled in {COUNTERS.relative_to(ROOT)}: {sorted(missing)}"


def test_every_gpu_of_every_unit_test_is_fed_every_enabled_dcgm_field(tmp_path):
    """What the promtool cases run on: each GPU a case names carries all of counters.csv's fields (the NVLink error
    counters among them), not only those the case is about."""
    fields = set(series_fields())
    assert {
        f"DCGM_FI_DEV_NVLINK_{k}_ERROR_COUNT_TOTAL" for k in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY")
    } <= fields
    copy = _with_every_enabled_counter(tmp_path)
    gpus = 0
    for f in sorted((copy / "tests").glob("*.test.yaml")):
        for case in yaml.safe_load(f.read_text())["tests"]:
            per_gpu: dict[str, set[str]] = {}
            for entry in case["input_series"]:
                name, labels = parse_series(entry["series"])
                if name.startswith("DCGM_") and "UUID" in labels:
                    per_gpu.setdefault(labels["UUID"], set()).add(name)
            for uuid, names in per_gpu.items():
                assert names == fields, f"{f.name} {case['name']!r} {uuid}: missing {sorted(fields - names)}"
            gpus += len(per_gpu)
    assert gpus >= 30
