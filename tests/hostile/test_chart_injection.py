"""The chart with hostile values: no string in values.yaml can add a flag to a container or an object to a release.

Found in the hostile trial (issue 32, item 3): the embedded scraper's selectors were written unquoted into the
adapter's and controller's args, so a value holding a line break added ``--insecure-port=8080`` and
``--insecure-bind-address=0.0.0.0`` (unauthenticated HTTP on every interface) and `helm template` exited 0.

Every string leaf of values.yaml (walked, not listed, so a new value is covered the day it is added) gets each
payload below, rendered by the pinned helm with the features on that make the value reach a template. For each,
either the render fails and helm's message names the value (its JSON pointer, as values.schema.json reports it),
or the render is harmless: the same objects as without the payload, every container with the same command, the
same flags in the same order and no other field changed. Helm reports every schema violation of one values file
together, so a payload goes into all the leaves of a variant at once; the leaves the schema accepts it for are
then rendered together, and one by one only when that render is not harmless (to say which).

The schema's label-selector pattern is checked against gpuscale's own parser (gpuscale.selectors, which follows
labels.Parse): what the chart accepts, the adapter and controller start with.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscale.errors import SelectorError
from gpuscale.selectors import LabelSelector
from tests.helm import CHART, NAMESPACE, RELEASE, run_helm

Leaf = tuple[str, ...]
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())

FLAG = "--insecure-port=8080"
LONG_BYTES = 256 * 1024
# name → how it turns a value's default into the hostile value.
PAYLOADS: dict[str, Callable[[str], str]] = {
    "newline + flag": lambda v: f"{v}\n{FLAG}",
    "newline + list item (adapter, controller)": lambda v: f"{v}\n            - {FLAG}",
    "newline + list item (report)": lambda v: f"{v}\n                - {FLAG}",
    "newline + key": lambda v: f"{v}\n          command: [sh, -c, id]",
    "double quote + flag": lambda v: f'{v}" {FLAG}',
    "single quote + flag": lambda v: f"{v}' {FLAG}",
    "flow sequence": lambda v: f"{v}], {FLAG}, [",
    "carriage return + flag": lambda v: f"{v}\r{FLAG}",
    "tab + flag": lambda v: f"{v}\t{FLAG}",
    "comment": lambda v: f"{v} #{FLAG}",
    "template action": lambda v: f"{v}{{{{ .Release.Name }}}}{{{{",
    "document separator": lambda v: f"{v}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: injected}}\n",
    "very long": lambda v: v + "a" * LONG_BYTES,
}

# Which values a leaf needs around it to reach a template (the rest of the chart is on in every variant).
EVERYTHING_ON: dict[str, Any] = {
    "controller": {"drain": True, "hintSafeToEvict": True},
    "report": {"enabled": True, "configMap": True},
    "monitoring": {k: {"enabled": True} for k in ("serviceMonitor", "podMonitor", "dcgmExporter", "prometheusRules")}
    | {"dashboards": {"enabled": True, "namespace": "grafana"}},
}
VARIANTS: dict[str, dict[str, Any]] = {
    "prometheus": EVERYTHING_ON,
    "victoriametrics": {
        **EVERYTHING_ON,
        "metricsSource": {"type": "victoriametrics", "victoriametrics": {"url": "http://vmselect:8481/select/0/p"}},
    },
    "embedded": {**EVERYTHING_ON, "report": {"enabled": False}, "metricsSource": {"type": "embedded"}},
}
WORKLOADS = {"Deployment", "CronJob"}


def string_leaves(node: Any, path: Leaf = ()) -> Iterator[tuple[Leaf, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from string_leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from string_leaves(value, (*path, str(i)))
    elif isinstance(node, str):
        yield path, node


LEAVES = dict(string_leaves(VALUES))


def variant_of(leaf: Leaf) -> str:
    if leaf[:2] == ("metricsSource", "embedded"):
        return "embedded"
    if leaf[:2] == ("metricsSource", "victoriametrics"):
        return "victoriametrics"
    return "prometheus"


def pointer(leaf: Leaf) -> str:
    """The leaf as helm's schema errors name it (a JSON pointer: '/' in a key is written '~1')."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in leaf)


def with_values(base: dict[str, Any], overrides: dict[Leaf, str]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for leaf, value in overrides.items():
        node = out
        for part in leaf[:-1]:
            node = node.setdefault(part, {})
        node[leaf[-1]] = value
    return out


class Helm:
    """`helm template` with a values file; counts renders and keeps the slowest one's figures."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary, self.directory = binary, directory
        self.renders = 0
        self.slowest = (0.0, "")

    def render(self, values: dict[str, Any], what: str) -> tuple[int, str, str]:
        path = self.directory / f"values-{self.renders}.json"
        path.write_text(json.dumps(values))
        self.renders += 1
        start = time.monotonic()
        done = run_helm(
            self.binary, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", "1.30.0",
            "--values", str(path),
        )  # fmt: skip
        self.slowest = max(self.slowest, (time.monotonic() - start, what))
        path.unlink()
        return done.returncode, done.stdout, done.stderr


def shape(manifest: str) -> dict[tuple[str, str, str], Any]:
    """The objects by (kind, namespace, name); for a workload, its pod's fields and each container's fields,
    command and flag names (values may differ: a hostile value may land, quoted, where it belongs)."""
    out: dict[tuple[str, str, str], Any] = {}
    for obj in filter(None, yaml.safe_load_all(manifest)):
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        assert key not in out, f"{key} rendered twice"
        if obj["kind"] in WORKLOADS:
            spec = obj["spec"]
            pod = (spec["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else spec)["template"]["spec"]
            containers = [
                (sorted(c), c.get("command"), [a.split("=", 1)[0] for a in c.get("args", [])])
                for c in pod.get("containers", [])
            ]
            out[key] = (sorted(pod), containers)
        else:
            out[key] = obj["kind"]
    return out


def harmless(manifest: str, baseline: dict[tuple[str, str, str], Any]) -> str:
    """ "" when the render has the baseline's objects and containers (flag names, not values); else what differs."""
    try:
        rendered = shape(manifest)
    except yaml.YAMLError as e:  # NB: helm exits 0 on a manifest that is not YAML: kubectl would refuse it
        return f"the manifest does not parse: {str(e).splitlines()[0]}"
    if rendered.keys() != baseline.keys():
        return f"objects differ: added {rendered.keys() - baseline.keys()}, lost {baseline.keys() - rendered.keys()}"
    changed = [k for k in baseline if rendered[k] != baseline[k]]
    return f"workloads changed: {changed}: {[rendered[k] for k in changed]}" if changed else ""


@pytest.fixture(scope="module")
def renderer(helm, tmp_path_factory) -> Helm:
    return Helm(helm, tmp_path_factory.mktemp("chart-injection"))


def test_values_yaml_has_the_leaves_this_test_walks():
    """The walk finds the values the trial used, and the variants make them reach a template."""
    assert ("metricsSource", "embedded", "dcgmExporterSelector") in LEAVES
    assert ("metricsSource", "embedded", "tritonSelector") in LEAVES
    assert len(LEAVES) >= 30, sorted(LEAVES)


def test_no_string_value_adds_a_flag_or_an_object(renderer):
    outcomes: dict[str, int] = {"refused naming the value": 0, "rendered harmless": 0}
    problems: list[str] = []
    for variant, base in VARIANTS.items():
        leaves = {leaf: default for leaf, default in LEAVES.items() if variant_of(leaf) == variant}
        code, manifest, stderr = renderer.render(base, variant)
        assert code == 0, f"{variant}: the variant itself fails:\n{stderr}"
        baseline = shape(manifest)
        for name, make in PAYLOADS.items():
            code, _, stderr = renderer.render(with_values(base, {leaf: make(v) for leaf, v in leaves.items()}), name)
            refused = {leaf for leaf in leaves if code != 0 and f"'{pointer(leaf)}'" in stderr}
            outcomes["refused naming the value"] += len(refused)
            accepted = sorted(leaves.keys() - refused)
            # The accepted leaves together first: harmless together is harmless one by one (each changes only
            # its own field), which keeps the run at ~2 renders per payload; one by one only to say which.
            code, manifest, stderr = renderer.render(
                with_values(base, {leaf: make(leaves[leaf]) for leaf in accepted}), f"{name}: accepted together"
            )
            if accepted and code == 0 and not harmless(manifest, baseline):
                outcomes["rendered harmless"] += len(accepted)
                continue
            for leaf in accepted:
                code, manifest, stderr = renderer.render(with_values(base, {leaf: make(leaves[leaf])}), name)
                if code != 0:
                    problems.append(f"{pointer(leaf)} + {name}: refused without naming it: {stderr[:300]}")
                elif why := harmless(manifest, baseline):
                    problems.append(f"{pointer(leaf)} + {name}: rendered, and {why}")
                else:
                    outcomes["rendered harmless"] += 1
    tried = len(LEAVES) * len(PAYLOADS)
    print(
        f"\nchart injection: {len(LEAVES)} string values x {len(PAYLOADS)} payloads = {tried} hostile inputs, "
        f"{outcomes}; {renderer.renders} helm renders, slowest {renderer.slowest[0]:.2f} s ({renderer.slowest[1]})"
    )  # NB: no helm peak here: a child's ru_maxrss starts from this worker's high-water mark (test_chart_policies)
    assert not problems, "\n".join(problems)
    assert sum(outcomes.values()) == tried


def test_a_command_line_value_is_refused_naming_it(renderer):
    """The trial's own input, one value at a time: the message says which value and why."""
    for leaf in (("dcgmExporterSelector",), ("tritonSelector",)):
        hostile = {"metricsSource": {"type": "embedded", "embedded": {leaf[0]: f"app=x\n            - {FLAG}"}}}
        code, manifest, stderr = renderer.render(hostile, leaf[0])
        assert code != 0 and not manifest, manifest
        assert f"'/metricsSource/embedded/{leaf[0]}'" in stderr and "does not match pattern" in stderr, stderr


# --- the schema's label-selector pattern against gpuscale's parser --------------------------------------------

SELECTOR_PATTERN = re.compile(SCHEMA["definitions"]["labelSelector"]["pattern"].replace("$", r"\Z"))
SELECTORS = (
    "app=nvidia-dcgm-exporter",
    "app.kubernetes.io/name=dcgm-exporter",
    "gpuscale.io/scrape=triton",
    "app==x,tier!=web",
    "app, !canary",
    "env in (prod, staging),app notin (a,b)",
    "app=",
    "gpus>2",
    "x in ()",
    "x in (a,)",
    " app = x ",
    "!a=b",
    "app=a b",
    "app=x\n--insecure-port=8080",
    "app=x --insecure-port=8080",
    '"app"=x',
    "app=x'",
    "-app=x",
    "app=x,",
    ",app=x",
    "a/b/c=x",
    "app=" + "v" * 64,
    "UPPER.example.com/app=x",
    "{{ .Release.Name }}",
)


@pytest.mark.parametrize("text", SELECTORS)
def test_the_schema_accepts_a_selector_exactly_when_gpuscale_parses_it(text):
    try:
        LabelSelector.parse(text)
        parses = True
    except SelectorError:
        parses = False
    assert bool(SELECTOR_PATTERN.match(text)) is parses
