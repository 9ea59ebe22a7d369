"""Mistakes a user of report, simulate and controller can make: one line on stderr naming the flag or file, exit 2.

Each row is a command line (``{tmp}`` is a fresh directory holding a small trace, an HPA manifest and a broken
kubeconfig) and a fragment the one-line message must contain. None of these reach the network.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscale.cli.main import main

REPO = Path(__file__).resolve().parents[2]
HPA = REPO / "deploy" / "examples" / "llm-hpa.yaml"

CASES = [
    # A typo in --policies used to fall back to the shipped policies without a word.
    (["report", "--from", "{tmp}/trace.csv", "--policies", "{tmp}/no-such-dir"], "--policies: {tmp}/no-such-dir"),
    (
        ["simulate", "--trace", "{tmp}/trace.csv", "--hpa", str(HPA), "--policies", "{tmp}/nope"],
        "--policies: {tmp}/nope",
    ),
    # A file that is not an export used to quote numpy's advice to unpickle it.
    (["report", "--from", "{tmp}/trace.csv"], "{tmp}/trace.csv: not a gpuscale history file (not an .npz archive"),
    # An unwritable chart path used to end a finished simulation in a traceback.
    (["simulate", "--trace", "{tmp}/trace.csv", "--hpa", str(HPA), "--html", "{tmp}/no/dir/x.html"], "--html"),
    # A server without its scheme used to be retried (report), or to leave a server unready for good (adapter).
    *(
        ([command, *extra, "--prometheus-url", "prometheus:9090"], "--prometheus-url: 'prometheus:9090' is not an http")
        for command, extra in [
            ("report", []),
            ("simulate", ["--hpa", str(HPA)]),
            ("controller", []),
            ("adapter", []),
            ("top", ["gpus"]),
        ]
    ),
    # A kubeconfig that is not YAML used to end in yaml.parser's traceback.
    (
        ["controller", "--prometheus-url", "http://127.0.0.1:9", "--kubeconfig", "{tmp}/kubeconfig", "--dry-run"],
        "{tmp}/kubeconfig: --kubeconfig: line 3, column 1: invalid YAML",
    ),
]


@pytest.mark.parametrize(("argv", "says"), CASES, ids=[" ".join(c[0][:2]) + f" #{i}" for i, c in enumerate(CASES)])
def test_a_user_error_is_one_line_naming_what_is_wrong(tmp_path, capsys, argv, says):
    (tmp_path / "trace.csv").write_text(
        "timestamp,input_tokens,output_tokens\n" + "".join(f"{i},500,20\n" for i in range(60))
    )
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nclusters: [\n")
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert says.replace("{tmp}", str(tmp_path)) in err, err
    assert "Traceback" not in err
