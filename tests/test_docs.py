"""The documentation: the manual in docs/ builds in MkDocs' strict mode (no broken link, no
page left out), the configuration reference is generated from the declarations and not
stale, and the README is a front page whose links all lead somewhere."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

from mtx.config import markdown

ROOT = Path(__file__).resolve().parents[1]


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip


def test_the_manual_builds_in_strict_mode_and_a_broken_link_fails_it(tmp_path):
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "config" / "index.html").is_file()
    # the same docs with one broken link: strict mode refuses them
    shutil.copytree(ROOT / "docs", tmp_path / "copy" / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "copy")
    page = tmp_path / "copy" / "docs" / "data.md"
    page.write_text(page.read_text() + "\nSee [nowhere](nowhere.md).\n")
    broken = build(tmp_path / "copy", tmp_path / "site2")
    assert broken.returncode != 0 and "nowhere.md" in broken.stderr


def test_the_configuration_reference_is_generated_from_the_declarations():
    assert (ROOT / "docs" / "config.md").read_text() == markdown(), (
        "docs/config.md is stale: run `make config-doc`"
    )


def test_the_readme_is_a_front_page_whose_links_lead_somewhere():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        assert target.exists(), f"README links to {link}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", target.read_text(), re.M)
            slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README links to {link}: no such heading"
