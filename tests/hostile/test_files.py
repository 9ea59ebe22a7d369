"""Hostile files where a command reads its catalogue and policies (issue 32 item 4): YAML bombs (billion laughs,
merge keys), 100 MB and 50,000-entry files, deep nesting, recursive aliases, duplicate keys, bad bytes, and
paths that are not files (FIFO, /dev/zero, a directory), as ``--config`` and in a ``--policies`` directory; and
every kubeconfig and credential file top, controller, report and adapter take (``--kubeconfig`` and the files its
current context names, bearer tokens, CA bundles, client and serving certificates and keys).

The catalogue cases run `gpuscale simulate` (the command that reads the catalogue offline), the others the command
that takes the flag, each under tests/hostile/limits.py's memory cap: refused with exit 2 and one line naming the
file (and the flag), well within the limit, or a clean success.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hostile.limits import Outcome, assert_refused_cleanly, run_cli
from tests.hostile.test_simulate_inputs import TRACE, _block_nesting, _laughs, _merge_bomb, hpa

SECONDS = 30.0
SHIPPED = Path(__file__).resolve().parents[2] / "policies" / "metrics.yaml"
OK = None


@dataclass(frozen=True)
class Case:
    id: str
    says: str | None
    content: str | bytes | None  # the catalogue's content; None: a special path (``path``)
    path: str | None = None


def _cases() -> list[Case]:
    shipped = SHIPPED.read_text()
    return [
        Case("shipped catalogue", OK, shipped),
        Case("shipped catalogue with BOM", OK, "\ufeff" + shipped),
        Case("billion laughs", "nodes", _laughs() + shipped),
        Case("merge-key bomb", "nodes", _merge_bomb() + shipped),
        Case("recursive alias", "recursive alias", "a: &a [*a]\n" + shipped),
        Case("50,000 metric entries", "nodes", "metrics:\n" + "".join(f"  - name: m{i}\n" for i in range(50_000))),
        Case("50,000 bare entries", "metrics", "metrics:\n" + "".join(f"  - m{i}\n" for i in range(49_000))),
        Case("nested 10,000 deep (flow)", "nesting depth", "a: " + "[" * 10_000 + "]" * 10_000 + "\n"),
        Case("nested 2,000 deep (block)", "nested deeper", _block_nesting(2_000)),
        Case("duplicate key", "appears twice", shipped + "\nmetrics: []\n"),
        Case("not UTF-8", "not UTF-8", shipped.encode() + b"\n# \xc3\x28\n"),
        Case("two documents", "one YAML document", shipped + "\n---\n" + shipped),
        Case("int of 5,000 digits", "invalid YAML", "x: " + "9" * 5000 + "\n" + shipped),
        Case("100 MB file", "limit", None, "big"),
        Case("/dev/zero", "character device", None, "/dev/zero"),
        Case("FIFO", "FIFO", None, "fifo"),
        Case("directory", "a directory", None, "dir"),
    ]


def _prepare(where: Path, case: Case, name: str) -> Path:
    """The case's catalogue at ``where/name`` (or the special file it names); the manifest and trace beside."""
    (where / "h.yaml").write_text(hpa())
    (where / "t.csv").write_text(TRACE)
    target = where / name
    if case.content is not None:
        target.write_bytes(case.content.encode() if isinstance(case.content, str) else case.content)
    elif case.path == "big":
        with open(target, "wb") as f:
            f.truncate(100 * 1024 * 1024)  # NB: sparse
    elif case.path == "fifo":
        os.mkfifo(target)
    elif case.path == "dir":
        target.mkdir()
    else:
        return Path(case.path or "")
    return target


WORST: dict[str, float] = {"peak_rss_bytes": 0, "seconds": 0, "inputs": 0}


def _judge(case: Case, outcome: Outcome, *, names: str) -> None:
    WORST["inputs"] += 1
    WORST["peak_rss_bytes"] = max(WORST["peak_rss_bytes"], outcome.peak_rss_bytes)
    WORST["seconds"] = max(WORST["seconds"], outcome.seconds)
    if case.says is OK:
        assert outcome.code == 0 and not outcome.traceback, outcome.stderr[-3000:]
        json.loads(outcome.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
        return
    assert_refused_cleanly(outcome, says=case.says)
    assert names in outcome.stderr, outcome.stderr


CASES = _cases()
SIMULATE = ["simulate", "--trace", "t.csv", "--hpa", "h.yaml", "--output", "json"]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_config_flag(case: Case, tmp_path: Path) -> None:
    path = _prepare(tmp_path, case, "catalogue.yaml")
    outcome = run_cli([*SIMULATE, "--config", str(path)], seconds=SECONDS, cwd=tmp_path)
    _judge(case, outcome, names=str(path))


@pytest.mark.parametrize("case", [c for c in CASES if c.path != "/dev/zero"], ids=lambda c: c.id)
def test_policies_directory(case: Case, tmp_path: Path) -> None:
    """The same files as a --policies directory's metrics.yaml (a ConfigMap mount in a cluster)."""
    policies = tmp_path / "policies"
    policies.mkdir()
    path = _prepare(tmp_path, case, "policies/metrics.yaml")
    outcome = run_cli([*SIMULATE, "--policies", str(policies)], seconds=SECONDS, cwd=tmp_path)
    _judge(case, outcome, names=str(path))


def test_refusals_are_fast(tmp_path: Path) -> None:
    """A bomb is refused before it costs anything: the run takes about as long as a refused missing file."""
    bomb = _prepare(tmp_path, Case("bomb", "nodes", _laughs()), "bomb.yaml")
    outcome = run_cli([*SIMULATE, "--config", str(bomb)], seconds=SECONDS, cwd=tmp_path)
    missing = run_cli([*SIMULATE, "--config", str(tmp_path / "missing.yaml")], seconds=SECONDS, cwd=tmp_path)
    assert_refused_cleanly(outcome, says="nodes")
    assert outcome.seconds < missing.seconds + 1.0, (outcome.seconds, missing.seconds)
    assert outcome.peak_rss_bytes < missing.peak_rss_bytes + 50 * 2**20


# --- kubeconfigs and credential files, at every command that takes them -------------------------------------

NOWHERE = "http://127.0.0.1:9"  # NB: discard port: nothing answers, and no case may get as far as asking
GOOD_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"%s}}]
users: [{name: u, user: {%s}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def _kubeconfig(*, cluster: str = "", user: str = "token: t") -> str:
    return GOOD_KUBECONFIG % (f", {cluster}" if cluster else "", user)


STRUCTURAL = [  # what any file a flag names can be
    Case("/dev/zero", "character device", None, "/dev/zero"),
    Case("FIFO", "FIFO", None, "fifo"),
    Case("directory", "a directory", None, "dir"),
    Case("100 MB file", "limit", None, "big"),
]
BY_KIND = {
    "kubeconfig": [
        *STRUCTURAL,
        Case("billion laughs", "nodes once its aliases are expanded", _laughs() + _kubeconfig()),
        Case("merge-key bomb", "nodes", _merge_bomb() + _kubeconfig()),
        Case("nested 10,000 deep", "nesting depth", "a: " + "[" * 10_000 + "]" * 10_000 + "\n" + _kubeconfig()),
        Case("not UTF-8", "not UTF-8", _kubeconfig().encode() + b"# \xc3\x28\n"),
        # the files the current context names, relative to the kubeconfig's directory
        Case("tokenFile a FIFO", "tokenFile of user 'u'", _kubeconfig(user="tokenFile: side/fifo")),
        Case(
            "certificate-authority /dev/zero",
            "certificate-authority of cluster 'c'",
            _kubeconfig(cluster="certificate-authority: /dev/zero"),
        ),
        Case(
            "client-key 100 MB",
            "client-key of user 'u'",
            _kubeconfig(user="client-certificate: cert.pem, client-key: side/big"),
        ),
        Case("certificate-authority a directory", "a directory", _kubeconfig(cluster="certificate-authority: side")),
    ],
    "token": [*STRUCTURAL, Case("not UTF-8", "not UTF-8", b"\xff\xfe\x00t\x00o\x00k\x00")],
    "ca": [
        *STRUCTURAL,
        Case("not PEM", "not a PEM certificate bundle", "-----BEGIN CERTIFICATE-----\nnot base64\n"),
        Case("not UTF-8", "not", b"\xe9t\xe9\n"),
    ],
    "pem": STRUCTURAL,
}

_ADAPTER = ("adapter", "--log-level", "warning")
_SCRAPE = ("--scrape-url", f"{NOWHERE}/metrics")
_PROM = ("--prometheus-url", NOWHERE)
SITES = [  # (command line with {file} where the hostile file goes, the flag the refusal names, kind of file)
    (("top", "gpus", *_SCRAPE, "--kubeconfig", "{file}"), "--kubeconfig", "kubeconfig"),
    (("top", "gpus", *_PROM, "--prometheus-token-file", "{file}"), "--prometheus-token-file", "token"),
    (("controller", *_PROM, "--dry-run", "--kubeconfig", "{file}"), "--kubeconfig", "kubeconfig"),
    (("controller", *_PROM, "--dry-run", "--prometheus-token-file", "{file}"), "--prometheus-token-file", "token"),
    (("report", *_PROM, "--kubeconfig", "{file}"), "--kubeconfig", "kubeconfig"),
    (("report", *_PROM, "--prometheus-token-file", "{file}"), "--prometheus-token-file", "token"),
    (("report", *_PROM, "--prometheus-ca-file", "{file}"), "--prometheus-ca-file", "ca"),
    ((*_ADAPTER, "--insecure-port", "0", *_SCRAPE, "--kubeconfig", "{file}"), "--kubeconfig", "kubeconfig"),
    (
        (*_ADAPTER, "--insecure-port", "0", *_PROM, "--prometheus-token-file", "{file}"),
        "--prometheus-token-file",
        "token",
    ),
    ((*_ADAPTER, "--insecure-port", "0", *_PROM, "--prometheus-ca-file", "{file}"), "--prometheus-ca-file", "ca"),
    (
        (*_ADAPTER, "--insecure-port", "0", *_PROM, "--prometheus-client-cert", "{file}"),
        "--prometheus-client-cert",
        "pem",
    ),
    (
        (*_ADAPTER, "--insecure-port", "0", *_PROM, "--prometheus-client-key", "{file}"),
        "--prometheus-client-key",
        "pem",
    ),
    # NB: with --insecure-port too: the secure port's files are refused before the plain port listens
    (
        (*_ADAPTER, "--insecure-port", "0", "--secure-port", "0", *_SCRAPE, "--client-ca-file", "{file}"),
        "--client-ca-file",
        "ca",
    ),
    (
        (*_ADAPTER, "--secure-port", "0", *_SCRAPE, "--requestheader-client-ca-file", "{file}"),
        "--requestheader-client-ca-file",
        "ca",
    ),
    (
        (*_ADAPTER, "--secure-port", "0", *_SCRAPE, "--tls-cert-file", "{file}", "--tls-private-key-file", "{key}"),
        "--tls-cert-file",
        "pem",
    ),
    (
        (*_ADAPTER, "--secure-port", "0", *_SCRAPE, "--tls-cert-file", "{cert}", "--tls-private-key-file", "{file}"),
        "--tls-private-key-file",
        "pem",
    ),
]
# simulate takes none of these flags (gpuscale simulate --help): its files are the cases above.
SITE_CASES = [(argv, flag, case) for argv, flag, kind in SITES for case in BY_KIND[kind]]


def _site_id(item: tuple[tuple[str, ...], str, Case]) -> str:
    argv, flag, case = item
    return f"{argv[0]} {flag}: {case.id}"


def _side_files(where: Path) -> None:
    """Files a kubeconfig case names (side/fifo, side/big) and a valid serving pair (cert.pem, key.pem)."""
    from gpuscale.adapter.tls import ensure_self_signed_cert

    side = where / "side"
    side.mkdir()
    os.mkfifo(side / "fifo")
    with open(side / "big", "wb") as f:
        f.truncate(100 * 1024 * 1024)
    pair = ensure_self_signed_cert(where / "pair", hosts=["localhost"])
    (where / "cert.pem").write_bytes(pair.cert_file.read_bytes())
    (where / "key.pem").write_bytes(pair.key_file.read_bytes())


@pytest.mark.parametrize("item", SITE_CASES, ids=[_site_id(i) for i in SITE_CASES])
def test_kubeconfig_and_credential_flags(item: tuple[tuple[str, ...], str, Case], tmp_path: Path) -> None:
    """Each file a command is given to reach Kubernetes or Prometheus (or to serve TLS), hostile: refused at start,
    exit 2, one line naming the file and the flag (or the kubeconfig entry), under the 2 GiB cap, before anything
    connects or listens (the servers log nothing: no "serving" line)."""
    argv, flag, case = item
    _side_files(tmp_path)
    path = _prepare(tmp_path, case, "given")
    filled = [
        a.format(file=path, cert=tmp_path / "cert.pem", key=tmp_path / "key.pem") if "{" in a else a for a in argv
    ]
    outcome = run_cli(filled, seconds=SECONDS, cwd=tmp_path)
    _judge(case, outcome, names=str(path))
    assert flag in outcome.stderr, outcome.stderr
    assert "serving" not in outcome.stderr.lower()


@pytest.mark.parametrize(
    ("argv", "hostile"),
    [
        (("top", "gpus", *_SCRAPE, "--kubeconfig"), Case("bomb", "nodes", _laughs() + _kubeconfig())),
        ((*_ADAPTER, "--insecure-port", "0", *_SCRAPE, "--kubeconfig"), Case("bomb", "nodes", _laughs())),
        (("controller", *_PROM, "--dry-run", "--prometheus-token-file"), Case("FIFO", "FIFO", None, "fifo")),
        (("report", *_PROM, "--prometheus-ca-file"), Case("/dev/zero", "character device", None, "/dev/zero")),
    ],
    ids=["top kubeconfig bomb", "adapter kubeconfig bomb", "controller FIFO token", "report /dev/zero CA"],
)
def test_credential_refusals_take_what_a_missing_file_takes(
    argv: tuple[str, ...], hostile: Case, tmp_path: Path
) -> None:
    """Within a second of a refused missing file, and within 50 MiB of its memory."""
    path = _prepare(tmp_path, hostile, "given")
    outcome = run_cli([*argv, str(path)], seconds=SECONDS, cwd=tmp_path)
    missing = run_cli([*argv, str(tmp_path / "missing")], seconds=SECONDS, cwd=tmp_path)
    assert_refused_cleanly(outcome, says=hostile.says)
    assert_refused_cleanly(missing)
    assert outcome.seconds < missing.seconds + 1.0, (outcome.seconds, missing.seconds)
    assert outcome.peak_rss_bytes < missing.peak_rss_bytes + 50 * 2**20


def test_summary() -> None:
    """The worst of the cases above (run first, in file order; per worker under xdist): for the report."""
    print(
        f"\nhostile files: {WORST['inputs']:.0f} tried, worst peak RSS "
        f"{WORST['peak_rss_bytes'] / 2**20:.0f} MiB, slowest {WORST['seconds']:.1f} s"
    )
    assert WORST["peak_rss_bytes"] < 1.5 * 2**30
