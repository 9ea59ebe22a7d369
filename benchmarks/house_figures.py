"""Figures of issue 33's closing note, counted from the source with ``ast`` (nothing imported):

* settings fields declared more than once: each field a command's settings class (or a settings group) declares,
  by name, in the modules that hold settings; a name declared in several classes is one copy per extra class;
* private cross-module imports: ``from gpuscale.x import _name`` in a module other than ``gpuscale.x``;
* the length of ``start_adapter`` (lines, decorators and docstring included) and of the functions it composes.

    python benchmarks/house_figures.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuscale"
# Where command settings live (the settings module and the commands whose settings sit beside them).
SETTINGS_MODULES = ("settings.py", "cli/report.py", "cli/simulate.py", "cli/top.py")


def _is_settings_class(node: ast.ClassDef) -> bool:
    """A pydantic model whose body declares at least one field with ``Field(...)``."""
    for stmt in node.body:
        value = getattr(stmt, "value", None)
        called = value.func if isinstance(stmt, ast.AnnAssign) and isinstance(value, ast.Call) else None
        if isinstance(called, ast.Name) and called.id == "Field":
            return True
    return False


def _is_group_use(stmt: ast.AnnAssign) -> bool:
    """``prometheus: PrometheusConnection = group(...)``: a command using a settings group, declared once elsewhere."""
    value = stmt.value
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "group"


def settings_fields() -> dict[str, list[str]]:
    """field name → the classes declaring it."""
    out: dict[str, list[str]] = {}
    for rel in SETTINGS_MODULES:
        path = PACKAGE / rel
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and _is_settings_class(node):
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        if "ClassVar" in ast.unparse(stmt.annotation) or _is_group_use(stmt):
                            continue
                        out.setdefault(stmt.target.id, []).append(f"{rel}:{node.name}")
    return out


def private_cross_imports() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        own = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpuscale"):
                if node.module == own:
                    continue
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(ROOT)}: from {node.module} import {alias.name}")
    return found


def function_lengths(path: Path, names: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in names:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out[node.name] = (node.end_lineno or node.lineno) - first + 1
    return out


def main() -> int:
    fields = settings_fields()
    repeated = {name: where for name, where in fields.items() if len(where) > 1}
    declarations = sum(len(w) for w in fields.values())
    print(f"settings fields: {declarations} declarations of {len(fields)} names")
    print(f"declared more than once: {len(repeated)} names, {sum(len(w) - 1 for w in repeated.values())} extra copies")
    for name, where in sorted(repeated.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"  {name} ×{len(where)}")
    private = private_cross_imports()
    print(f"private cross-module imports: {len(private)}")
    for line in private:
        print(f"  {line}")
    steps = (
        "start_adapter",
        "check_start",
        "make_cluster",
        "make_source",
        "make_scope",
        "make_forecasts",
        "make_pipeline",
        "make_servers",
    )
    lengths = function_lengths(PACKAGE / "cli" / "adapter.py", steps)
    print("cli/adapter.py function lengths (lines): " + ", ".join(f"{k} {v}" for k, v in lengths.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
