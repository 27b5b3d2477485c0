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


def test_every_set_in_the_manuals_examples_is_read_as_it_says():
    """Each `--set` of a shell example in docs/ is a value its key takes (as the shell passes it);
    a YAML list the reader cannot read is refused naming why, not split at its commas."""
    import shlex

    import pytest

    from mtx.config import Config, load_config
    from mtx.config.keys import set_key
    from mtx.errors import MtxError

    found = 0
    for page in sorted((ROOT / "docs").glob("*.md")):
        for block in re.findall(r"```[a-z]*\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            if "--set" not in block:
                continue  # a diagram, a config, output
            words = shlex.split(block.replace("\\\n", " "), comments=True)
            sets = [words[k + 1] for k, w in enumerate(words[:-1]) if w == "--set"]
            for value in sets:
                if "=" not in value or any(m in value for m in ("<", "PATH", "CKPT", "...")):
                    continue  # a placeholder for the reader's own value
                set_key(Config(), *value.split("=", 1))  # its type; a command checks the rest
                found += 1
    assert found > 5
    cfg = load_config(None, ["decode.placeholders=[braces, printf, 're:\\[\\[[a-z]+\\]\\]']"])
    assert cfg.decode.placeholders == ["braces", "printf", "re:\\[\\[[a-z]+\\]\\]"]
    with pytest.raises(MtxError, match="not a YAML list .*'single quotes'"):
        load_config(None, ['decode.placeholders=[braces, "re:\\[x\\]"]'])
