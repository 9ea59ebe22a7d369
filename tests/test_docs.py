"""The README fits on a screen and every relative link in it and in docs/ resolves (files and #anchors).

Anchors are GitHub's: a heading's text, lower-cased, without Markdown code marks and punctuation, spaces as
hyphens, a repeated heading suffixed -1, -2 … Links inside fenced code blocks are not links.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose(path.read_text()):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in _prose(path.read_text()):
        line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
        found += [(number, m.group(1)) for m in LINK.finditer(line)]
    return found


def test_slug_is_githubs():
    assert slug("`gpuscale top` and `kubectl gpu`") == "gpuscale-top-and-kubectl-gpu"
    assert slug("Controller: one reconcile at 1,250 nodes × 8 GPUs") == "controller-one-reconcile-at-1250-nodes--8-gpus"
    assert (
        slug("JSON (`--output json`, schema `gpuscale.simulate/v1`)") == "json---output-json-schema-gpuscalesimulatev1"
    )


def test_readme_fits_on_a_screen():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 15 * 1024, f"README.md is {size} bytes; move detail to docs/"


def test_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "README.md":
            assert f"({page.name})" in index, f"docs/README.md does not link {page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for number, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: …: not ours to check offline
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / unquote(file)).resolve() if file else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif not dest.is_relative_to(ROOT):
            broken.append(f"{where} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, "\n".join(broken)


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [bad](#nope)\n```\n[in code](nowhere.md)\n```\n")
    assert [t for _, t in links(page)] == ["#title", "missing.md", "#nope"]
    assert anchors(page) == {"title"}


def test_the_install_page_names_every_run_time_dependency():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0] for d in deps]
    page = (ROOT / "docs" / "install.md").read_text().lower()
    assert names and not [n for n in names if n.lower() not in page], names


def test_the_pages_a_user_reads_before_installing_say_the_controller_starts_in_dry_run():
    """issue 34: README, docs/install.md and docs/controller.md say dry-run is the default and name the one switch
    that makes it act, in the form the chart and deploy/controller take it."""
    import yaml

    chart = yaml.safe_load((ROOT / "deploy" / "charts" / "gpuscale" / "values.yaml").read_text())
    assert chart["controller"]["dryRun"] is True
    assert (ROOT / "deploy" / "controller" / "components" / "act" / "kustomization.yaml").is_file()
    for page in ("README.md", "docs/install.md", "docs/controller.md"):
        text = (ROOT / page).read_text()
        assert "dry-run" in text and "--set controller.dryRun=false" in text, page
        assert "deploy/controller/components/act" in text, page
    readme = (ROOT / "README.md").read_text()
    assert readme.index("The controller starts in dry-run") < readme.index("## Documentation")


def test_the_readme_testing_page_and_build_script_give_the_same_build_times():
    """issue 34: what command 2 needs and builds, with the measured range and its conditions, said alike where a
    user reads it (README), where the tests are explained (docs/testing.md) and in the script that builds."""
    sources = {
        "README.md": (ROOT / "README.md").read_text(),
        "docs/testing.md": (ROOT / "docs" / "testing.md").read_text(),
        "tests/cluster/build": (ROOT / "tests" / "cluster" / "build").read_text(),
    }
    for name, text in sources.items():
        flat = " ".join(text.replace("#", " ").split())
        assert "7 min 13 s" in flat and "idle" in flat, name
        assert "35.7 min" in flat and "load average 5-12" in flat, name
    readme = sources["README.md"]
    assert "Go ≥ 1.26" in readme and "~/.cache/gpuscale" in readme and "all you need" not in readme
    go_mod = (ROOT / "tests" / "cluster" / "go" / "kube" / "go.mod").read_text()
    assert re.search(r"^go 1\.26(\.\d+)?$", go_mod, re.MULTILINE), "README's Go version is go.mod's"
