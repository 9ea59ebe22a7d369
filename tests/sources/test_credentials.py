"""Credential files (sources/credentials.py): read once within files.py's limits, refused naming file and flag.

Scope: what a good token or CA bundle gives, and each refusal's one line. The commands that use them are driven
with hostile files in tests/hostile/test_files.py.
"""

from __future__ import annotations

import os

import pytest
import trustme

from gpuscale.errors import ConfigError
from gpuscale.settings import PrometheusConnection
from gpuscale.sources.credentials import read_token, verifying_context
from gpuscale.sources.promapi import check_credentials


def test_a_token_is_trimmed_as_client_go_does(tmp_path) -> None:
    (tmp_path / "token").write_text("\ufeffabc.def\n")
    assert read_token(str(tmp_path / "token"), flag="--prometheus-token-file") == "abc.def"


def test_a_ca_bundle_is_trusted(tmp_path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    context = verifying_context(str(tmp_path / "ca.pem"), flag="--prometheus-ca-file")
    subjects = [dict(part[0] for part in c["subject"]) for c in context.get_ca_certs()]
    assert any("trustme" in s.get("organizationName", "") for s in subjects), subjects


@pytest.mark.parametrize(
    ("argument", "content", "says"),
    [
        ("token_file", None, "{path}: --prometheus-token-file: cannot read bearer token: a FIFO (named pipe)"),
        ("token_file", b"x" * (64 * 1024 + 1), "{path}: --prometheus-token-file: bearer token larger than the 64 KiB"),
        ("token_file", b"\xff\n", "{path}: --prometheus-token-file: line 1: not UTF-8 text"),
        ("token_file", b"\n \n", "{path}: --prometheus-token-file: the bearer token file is empty"),
        ("token_file", b"abc\ndef\n", "{path}: --prometheus-token-file: not a bearer token"),
        ("token_file", b"abc def", "{path}: --prometheus-token-file: not a bearer token"),
        ("token_file", "tök".encode(), "{path}: --prometheus-token-file: not a bearer token"),
        ("ca_file", b"", "{path}: --prometheus-ca-file: the CA bundle is empty"),
        ("ca_file", b"-----BEGIN CERTIFICATE-----\nxx\n", "{path}: --prometheus-ca-file: not a PEM certificate bundle"),
        ("ca_file", None, "{path}: --prometheus-ca-file: cannot read CA bundle: a FIFO (named pipe)"),
        ("client_cert", None, "{path}: --prometheus-client-cert: cannot read client certificate: a FIFO"),
        ("client_key", b"k" * (4 * 2**20 + 1), "{path}: --prometheus-client-key: client key larger than the 4 MiB"),
    ],
)
def test_each_refusal_names_the_file_and_the_flag(tmp_path, argument: str, content: bytes | None, says: str) -> None:
    path = tmp_path / "given"
    if content is None:
        os.mkfifo(path)
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        check_credentials(PrometheusConnection(**{argument: str(path)}))
    assert str(info.value).startswith(says.format(path=path)), str(info.value)
    assert "\n" not in str(info.value)


def test_a_jwt_and_a_padded_token_are_bearer_tokens(tmp_path) -> None:
    for token in ("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_~+/", "dG9rZW4="):
        (tmp_path / "token").write_text(token + "\n")
        assert read_token(str(tmp_path / "token"), flag="--prometheus-token-file") == token


def test_an_answers_warnings_are_text_few_and_short() -> None:
    from gpuscale.sources.prom_answer import answer_warnings

    assert answer_warnings({"warnings": "one string"}) == ("one string",)  # not one warning per character
    many = answer_warnings({"warnings": [f"w{i}" * 1000 for i in range(10_000)]})
    assert len(many) == 10 and all(len(w) <= 300 for w in many)
    assert answer_warnings({"warnings": [None, {"a": 1}]}) == ("{'a': 1}",)
