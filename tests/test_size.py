"""A room you can hold in mind: no product file over 600 lines, no function over 80 (parsed with ``ast``).

The rooms that are still bigger are listed in OVER, each with the reason it stays big for now; a new file or
function past the limit fails here by name, and an entry that has come under the limit fails too, so OVER stays
the list of real exceptions and only shrinks. The limits are prometheus-adapter's and kopf's rough sizes, not a
law: a hot parser written as one loop (a function call per line would cost more than the parse) is kept whole on
purpose and says so here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuscale"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80

# "path" (a file over MAX_FILE_LINES) or "path:qualified.name" (a function over MAX_FUNCTION_LINES) → why.
OVER: dict[str, str] = {
    # Hot parsers, kept as one loop on purpose: the text-format parser reads every line of every exporter each
    # refresh (10k GPUs: ~2 M lines a minute; a call per line costs more than the parse, benchmarks/bench_parser.py)
    # and the selector grammar is one recursive-descent parser with its lexer, matched per object per request.
    "gpuscale/metrics/exposition.py": "hot parser: Prometheus text 0.0.4 and OpenMetrics",
    "gpuscale/metrics/exposition.py:_parse": "hot parser: one loop over every exposition line",
    "gpuscale/selectors.py": "one grammar: label and field selectors, their lexer, parser and matcher",
}


def _functions(node: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method under ``node``, nested ones included."""
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            assert child.end_lineno is not None
            found.append((f"{prefix}{child.name}", child.end_lineno - child.lineno + 1))
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            found += _functions(child, f"{prefix}{child.name}.")
    return found


def _sizes(package: Path = PACKAGE) -> dict[str, int]:
    """Every product file's line count and every function's, keyed as OVER is."""
    sizes: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package.parent).as_posix()
        text = path.read_text(encoding="utf-8")
        sizes[where] = len(text.splitlines())
        sizes.update((f"{where}:{name}", n) for name, n in _functions(ast.parse(text, filename=where)))
    return sizes


def _limit(key: str) -> int:
    return MAX_FUNCTION_LINES if ":" in key else MAX_FILE_LINES


def test_no_new_room_is_too_big():
    over = {key: n for key, n in _sizes().items() if n > _limit(key) and key not in OVER}
    assert not over, "over the size limit (split it by concern, or list it in OVER with the reason):\n" + "\n".join(
        f"  {key}: {n} lines (limit {_limit(key)})" for key, n in sorted(over.items())
    )


def test_every_exception_is_still_over():
    """An entry that has come under its limit is removed, so OVER stays the list of real exceptions."""
    sizes = _sizes()
    stale = sorted(key for key in OVER if sizes.get(key, 0) <= _limit(key))
    assert not stale, f"no longer over the limit (or gone), remove from OVER: {stale}"


def test_the_guard_sees_a_big_function(tmp_path):
    """The walk counts methods and async functions, so the guard cannot pass by missing them."""
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "gpuscale").mkdir()
    (tmp_path / "gpuscale" / "probe.py").write_text(f"class A:\n    async def m(self):\n{body}\n        return 0\n")
    sizes = _sizes(tmp_path / "gpuscale")
    assert sizes["gpuscale/probe.py:A.m"] == MAX_FUNCTION_LINES + 2
    assert sizes["gpuscale/probe.py"] == MAX_FUNCTION_LINES + 3
