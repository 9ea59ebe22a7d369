"""The architecture's one-way data flow, checked on every module's imports (parsed with ``ast``, nothing imported).

sources (I/O) → metrics (pure core) → consumers (adapter, top, controller, report, replay); cli/ is the
composition root and may import anything. Each row of LAYERS names the modules a layer holds and the gpuscale
modules and third-party packages it must never import; KNOWN_EXCEPTIONS lists, per file, the crossings that
exist today with the reason, so a new one fails here and an old one is visible.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuscale"

CORE = (
    "gpuscale.metrics",
    "gpuscale.hpa",
    "gpuscale.model",
    "gpuscale.pricing",
    "gpuscale.selectors",
    "gpuscale.config",
    "gpuscale.files",
    "gpuscale.errors",
    "gpuscale.policy_files",
    "gpuscale.disruption",
    "gpuscale.settings",
    "gpuscale.backoff",
)
CONSUMERS = ("gpuscale.adapter", "gpuscale.controller", "gpuscale.report", "gpuscale.replay", "gpuscale.top")
IO_LIBRARIES = ("aiohttp", "kubernetes_asyncio", "multidict")
ABOVE_CORE = ("gpuscale.sources", "gpuscale.pipeline", *CONSUMERS, "gpuscale.cli", "gpuscale.sim")


def _others(own: str) -> tuple[str, ...]:
    return tuple(c for c in CONSUMERS if c != own)


# (layer, modules in it, what none of them may import)
LAYERS = [
    ("pure core", CORE, (*ABOVE_CORE, *IO_LIBRARIES)),
    ("sources", ("gpuscale.sources",), ("gpuscale.pipeline", *CONSUMERS, "gpuscale.cli", "gpuscale.sim")),
    ("pipeline", ("gpuscale.pipeline",), ("gpuscale.sources", *CONSUMERS, "gpuscale.cli", "gpuscale.sim")),
    *(
        (
            f"consumer {own}",
            (own,),
            (*_others(own), "gpuscale.cli", "gpuscale.sim"),
        )
        for own in CONSUMERS
    ),
    # report/ and replay/ read histories and traces they are handed: no I/O of their own.
    ("pure consumers", ("gpuscale.report", "gpuscale.replay"), ("gpuscale.sources", *IO_LIBRARIES)),
    ("simulated cluster", ("gpuscale.sim",), ("gpuscale.sources", "gpuscale.pipeline", *CONSUMERS, "gpuscale.cli")),
]

# file → modules it may import despite its layer's rule, and why. Shrink this; never grow it without a reason.
KNOWN_EXCEPTIONS = {
    # The adapter's delegated authentication (TokenReview/SubjectAccessReview, the watched ConfigMap of CAs) and
    # its selector lookups use the Kubernetes client and watch cache directly; a protocol wired by cli/ would
    # remove these.
    "gpuscale/adapter/auth_config.py": ("gpuscale.sources.configmaps",),
    "gpuscale/adapter/delegation.py": ("gpuscale.sources.reflector",),
    "gpuscale/adapter/provider.py": ("gpuscale.sources.cluster_index",),
    # The controller's one writer (ENGINEERING.md §1: I/O in sources and in one actuator) and its leader lease.
    "gpuscale/controller/actuator.py": ("gpuscale.sources.kuberest",),
    "gpuscale/controller/leader.py": ("gpuscale.sources.kuberest",),
    # The controller repeats the adapter's refresh cycle (source → store) in-process.
    "gpuscale/controller/loop.py": ("gpuscale.pipeline",),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """Every module a file imports, absolute, with its line (relative imports resolved; names of a
    ``from package import name`` counted as modules too, so ``from gpuscale import sources`` is seen)."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize(("layer", "members", "forbidden"), LAYERS, ids=[row[0] for row in LAYERS])
def test_layer_imports_only_what_lies_below_it(layer, members, forbidden):
    crossings = []
    for path in MODULES:
        if not _within(_module_name(path), members):
            continue
        allowed = KNOWN_EXCEPTIONS.get(path.relative_to(ROOT).as_posix(), ())
        for line, name in _imports(path):
            if _within(name, forbidden) and not _within(name, allowed) and not _within(name, members):
                crossings.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not crossings, f"{layer} crosses a layer:\n" + "\n".join(sorted(set(crossings)))


def test_known_exceptions_still_exist():
    """An exception nobody needs any more is removed, so the table stays the list of real crossings."""
    for file, names in KNOWN_EXCEPTIONS.items():
        imported = [name for _, name in _imports(ROOT / file)]
        for allowed in names:
            assert any(_within(name, (allowed,)) for name in imported), f"{file} no longer imports {allowed}"


# Parts of one layer that must stay independent of each other: each planner of the controller decides from the
# observed state alone (one planner's bug or slowness never changes another's plan; loop.py runs them side by
# side), and the adapter's refresh scope (which objects a refresh fetches) never depends on its forecasts (what a
# forecast serves) nor the other way round. Each row: (what, {part: its modules}); no part imports another's.
INDEPENDENT = [
    (
        "controller planners",
        {
            # NB: each planner with the modules only it uses; the shared ones (drain, pools, telemetry, writes,
            # events) belong to none
            "health remediation": (
                "gpuscale.controller.health",
                "gpuscale.controller.gpu_problems",
                "gpuscale.controller.remediation_policy",
            ),
            "autoscaler hints": ("gpuscale.controller.hints",),
            "gang-aware capacity": (
                "gpuscale.controller.capacity",
                "gpuscale.controller.gangs",
                "gpuscale.controller.cliques",
                "gpuscale.controller.expander",
                "gpuscale.controller.provisioning",
            ),
        },
    ),
    (
        "adapter refresh scope and forecasts",
        {
            "refresh scope": ("gpuscale.adapter.asked_for", "gpuscale.metrics.refresh_scope"),
            "forecasts": (
                "gpuscale.adapter.forecasts",
                "gpuscale.metrics.demand",
                "gpuscale.metrics.workload_demand",
                "gpuscale.metrics.forecast",
            ),
        },
    ),
]


@pytest.mark.parametrize(("what", "parts"), INDEPENDENT, ids=[row[0] for row in INDEPENDENT])
def test_independent_parts_never_import_each_other(what, parts):
    crossings = []
    for part, members in parts.items():
        others = tuple(m for other, ms in parts.items() if other != part for m in ms)
        found = [path for path in MODULES if _within(_module_name(path), members)]
        assert found, f"{what}: no module of {part} ({members}) exists; update INDEPENDENT"
        for path in found:
            crossings += [
                f"{path.relative_to(ROOT)}:{line} ({part}) imports {name}"
                for line, name in _imports(path)
                if _within(name, others)
            ]
    assert not crossings, f"{what} depend on each other:\n" + "\n".join(sorted(set(crossings)))


# Import names of the distributions pyproject.toml declares (only where the two differ).
IMPORT_NAMES = {"PyYAML": "yaml", "kubernetes-asyncio": "kubernetes_asyncio", "prometheus-client": "prometheus_client"}
# Imported at run time through a declared dependency that guarantees it (aiohttp requires multidict).
TRANSITIVE = {"multidict"}


def test_product_code_imports_only_declared_run_time_dependencies():
    """A plain ``pip install gpuscale`` (no extras) must import every module: no test-only package at run time."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = set(TRANSITIVE)
    for requirement in declared:
        dist = requirement.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip()
        names.add(IMPORT_NAMES.get(dist, dist.replace("-", "_")))
    undeclared = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in MODULES
        for line, name in _imports(path)
        if (top := name.split(".")[0]) and top != "gpuscale" and top not in sys.stdlib_module_names
        if top not in names
    ]
    assert not undeclared, "\n".join(undeclared)


def test_relative_imports_are_resolved():
    """``from ..sources import kube`` in metrics/ is seen as gpuscale.sources.kube, so the table catches it."""
    text = "from ..sources import kube\nfrom . import store\nimport aiohttp.web\n"
    names = [name for _, name in _imports(PACKAGE / "metrics" / "aggregation.py", text)]
    assert {"gpuscale.sources.kube", "gpuscale.metrics.store", "aiohttp.web"} <= set(names)
    assert _within("gpuscale.sources.kube", LAYERS[0][2]) and _within("aiohttp.web", LAYERS[0][2])
