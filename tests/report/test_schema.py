"""The JSON report's schema is documented (docs/report.schema.json) and versioned: the file is the model's."""

from __future__ import annotations

import json
from pathlib import Path

from gpuscale.report.schema import SCHEMA, Report

DOC = Path(__file__).resolve().parents[2] / "docs" / "report.schema.json"


def test_the_documented_schema_is_the_models():
    assert json.loads(DOC.read_text()) == Report.model_json_schema(by_alias=True), (
        "regenerate: python -c 'import json; from gpuscale.report.schema import Report; "
        "print(json.dumps(Report.model_json_schema(by_alias=True), indent=2))' > docs/report.schema.json"
    )
    assert SCHEMA == "gpuscale.io/report/v2"
