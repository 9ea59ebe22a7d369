"""No name defined twice in the package: every module basename and every public top-level class name is unique.

A reader who meets ``history`` or ``Decision`` should not have to ask "which one?" (ENGINEERING.md §3: names say
what a thing is). Parsed with ``ast``, nothing imported. Not counted: ``__init__``/``__main__`` (one per package
by design), package names, and private classes (``_Section``: invisible outside their module).

ALLOWED lists the names still defined twice, each with the reason; the entry goes when the reason does, and
``test_every_allowed_name_is_still_defined_twice`` fails on one that outlived it.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuscale"

ALLOWED: set[str] = set()  # every module and class name is defined once


def _definitions() -> dict[str, list[str]]:
    """ "module NAME" / "class NAME" → the files that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        if path.stem not in ("__init__", "__main__"):
            found[f"module {path.stem}"].append(where)
        for node in ast.parse(path.read_text(), filename=where).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[f"class {node.name}"].append(where)
    return found


def test_no_module_or_class_name_is_defined_twice():
    twice = {name: files for name, files in _definitions().items() if len(files) > 1 and name not in ALLOWED}
    assert not twice, "defined more than once (rename one so each says what it is):\n" + "\n".join(
        f"{name}: {', '.join(files)}" for name, files in sorted(twice.items())
    )


def test_every_allowed_name_is_still_defined_twice():
    """An entry whose clash is gone is removed, so ALLOWED stays the list of real clashes."""
    found = _definitions()
    stale = sorted(name for name in ALLOWED if len(found.get(name, ())) < 2)
    assert not stale, f"no longer defined twice, remove from ALLOWED: {stale}"


def test_a_second_definition_is_found(tmp_path, monkeypatch):
    """The check sees a class and a module defined in two packages (so a pass above means something)."""
    for package in ("one", "two"):
        (tmp_path / "gpuscale" / package).mkdir(parents=True)
        (tmp_path / "gpuscale" / package / "__init__.py").write_text("")
        (tmp_path / "gpuscale" / package / "clash.py").write_text("class Twice:\n    pass\nclass _Private:\n    pass\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "gpuscale")
    twice = {name for name, files in _definitions().items() if len(files) > 1}
    assert twice == {"module clash", "class Twice"}


def test_no_private_name_crosses_a_module():
    """A ``_name`` is its module's own: another module needing it gets it under a public name, so what a module
    promises is what it exports (issue 33: private names had crossed modules six times)."""
    crossings = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpuscale"):
                crossings += [
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    assert not crossings, "private names imported across modules:\n" + "\n".join(crossings)
