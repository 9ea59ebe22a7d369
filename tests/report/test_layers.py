"""report/ is a consumer and pure: it reads the metrics core only (no sources, adapter, cli or controller)."""

from __future__ import annotations

import ast
from pathlib import Path

REPORT = Path(__file__).resolve().parents[2] / "gpuscale" / "report"
FORBIDDEN = ("gpuscale.sources", "gpuscale.adapter", "gpuscale.cli", "gpuscale.controller", "aiohttp", "kubernetes")


def test_report_imports_no_io_and_no_other_consumer():
    for path in REPORT.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names.append(node.module)
            bad = [n for n in names if n.startswith(FORBIDDEN)]
            assert not bad, f"{path.name} imports {bad}"
