"""`gpuscale controller` on bad input: one line naming the flag or file, exit status 2, no traceback."""

from __future__ import annotations

import pytest

from gpuscale.cli.main import main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--scrape-url: give --scrape-url (repeatable), --discover-exporters or --prometheus-url"),
        (
            ["--scrape-url", "http://a:9400/metrics", "--prometheus-url", "http://p:9090"],
            "--prometheus-url: give either",
        ),
        (["--prometheus-url", "http://p:9090", "--renew-deadline", "20s"], "--renew-deadline: needs --retry-period"),
        (["--prometheus-url", "http://p:9090", "--interval", "soon"], "--interval:"),
    ],
)
def test_bad_flags_are_one_line(capsys, args, message):
    assert main(["controller", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuscale controller: ") and message in err[0], err


def test_a_bad_policy_file_names_file_and_field(tmp_path, capsys):
    (tmp_path / "hints.yaml").write_text("version: 1\nidle: {below: 3}\nprotect: {gang_keys: [a]}\n")
    code = main(["controller", "--prometheus-url", "http://127.0.0.1:1", "--policies", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "hints.yaml" in err and "idle.below" in err and "Traceback" not in err


def test_no_cluster_is_one_line(tmp_path, capsys):
    code = main(["controller", "--prometheus-url", "http://127.0.0.1:1", "--kubeconfig", str(tmp_path / "none")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "kubeconfig" in err[0] and "does not exist" in err[0], err
