"""The documentation site: it builds with warnings as errors, its generated reference follows the code, its
runnable blocks run, and a reader finds their way (README short, every page reachable)."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "tools"))

from docs_pages import config_reference, method_pages, sections  # noqa: E402

#: a block runs when the line before its fence is this marker
RUNNABLE = re.compile(r"<!-- runnable -->\n```(bash|python)\n(.*?)```", re.S)
#: what MkDocs' plugins print on every build that is not about this site
NOISE = ("MkDocs 2.0", "mkdocs 2", "MkDocs may break", "ProperDocs", "Material for MkDocs")


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    return subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--config-file", str(config), "--site-dir",
                           str(site)], cwd=config.parent, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def page(site: Path, path: str) -> str:
    return (site / path / "index.html").read_text(encoding="utf-8")


def test_the_site_builds_with_its_generated_pages(site: Path) -> None:
    config = page(site, "reference/config")
    assert "<code>train.local_steps</code>" in config and "K_c, client SGD steps per round" in config
    cli = page(site, "reference/cli")
    for command in ("run", "compare", "bench", "flower-app", "export", "predict", "privacy-audit"):
        assert f"graphfed {command}" in cli, command
    assert "Panacea (Lin et al.)" in page(site, "reference/methods/panacea")
    assert "run_config" in page(site, "reference/api")
    report = page(site, "reports/paper/report")
    for image in re.findall(r'<img[^>]+src="([^"]+)"', report):
        assert (site / "reports/paper/report" / image).resolve().is_file(), image


def test_a_broken_link_or_reference_fails_the_build(tmp_path: Path) -> None:
    """Strict mode is what makes the check worth running: a link to a missing page is an error, not a warning."""
    shutil.copytree(DOCS, tmp_path / "docs")
    (tmp_path / "mkdocs.yml").write_text((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs" / "gen_pages.py").write_text("")  # the generated pages are not under test here
    how_to = tmp_path / "docs" / "how-to" / "data.md"
    how_to.write_text(how_to.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


def test_the_config_reference_lists_every_field_with_type_and_default() -> None:
    from graphfed.config import RunConfig, shown_default

    text = config_reference()
    for path, section, names in sections(RunConfig):
        for name in names:
            field = section.model_fields[name]
            row = next((line for line in text.splitlines() if line.startswith(f"| `{path}{name}` |")), None)
            assert row is not None, f"{path}{name} is not in the config reference"
            assert f"`{shown_default(field)}`" in row and field.description and field.description.split()[0] in row


def test_a_new_config_field_appears_with_no_hand_edit() -> None:
    from graphfed.config import RunConfig, TrainConfig

    class Train(TrainConfig):
        warmup_rounds: int = Field(default=3, ge=0, description="rounds before the first evaluation")

    class Run(RunConfig):
        train: Train = Field(default_factory=Train)

    class Extra(BaseModel):
        flag: bool | None = None

    assert "`train.warmup_rounds` | `int` | `3` | ≥ `0` | rounds before the first evaluation |" in config_reference(Run)
    assert "| `flag` | `bool | null` | `—` |" in config_reference(Extra)


def test_every_method_has_a_page_with_its_options_and_reports() -> None:
    from graphfed import catalogue

    methods = catalogue.load()["methods"]
    pages = method_pages({"methods": methods})
    assert set(pages) == {f"reference/methods/{name}.md" for name in methods} | {"reference/methods/index.md"}
    for name, entry in methods.items():
        text = pages[f"reference/methods/{name}.md"]
        assert entry["summary"] in text and entry["doc"].strip().splitlines()[0] in text
        for option, _, _ in entry["options"]:
            assert f"| `{option}` |" in text, (name, option)
    # a method a suite runs links that suite's report; one no suite runs links none
    assert "../../reports/robustness/report.md" in pages["reference/methods/panacea.md"]
    assert "../../reports/flha/report.md" in pages["reference/methods/flha-ghn.md"]


def runnable_pages() -> list[Path]:
    return sorted(path for path in DOCS.rglob("*.md") if "<!-- runnable -->" in path.read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.parametrize("markdown", runnable_pages(), ids=lambda path: str(path.relative_to(DOCS)))
def test_runnable_blocks_run_as_written(markdown: Path, tmp_path: Path) -> None:
    """Each page's runnable blocks, in order, in one empty folder, with the installed ``graphfed`` on the PATH."""
    blocks = RUNNABLE.findall(markdown.read_text(encoding="utf-8"))
    assert blocks
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "GRAPHFED_TRACEBACK": "1"}
    for number, (language, code) in enumerate(blocks, 1):
        command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (f"{markdown.name} block {number}:\n{code}\n{done.stdout[-2000:]}"
                                      f"{done.stderr[-3000:]}")
    if markdown.name == "tutorial.md":  # what the tutorial promises its reader
        rows = list(csv.DictReader((tmp_path / "predictions.csv").open()))
        assert len(rows) == 2 and all(row["prediction"] in ("0", "1") for row in rows), rows
        table = (tmp_path / "runs/clinics/compare.csv").read_text()
        assert all(method in table for method in ("fedavg", "ditto", "local")) and "macro_f1" in table


def test_the_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#\s]+)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_own_csvs_are_two_clicks_from_home_and_every_page_is_in_the_navigation() -> None:
    import yaml

    home = (DOCS / "index.md").read_text(encoding="utf-8")
    assert "(how-to/own-federation.md)" in home  # home -> the guide: one click
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [page for item in node for page in pages(item)]
        if isinstance(node, dict):
            return [page for value in node.values() for page in pages(value)]
        return []

    listed = set(pages(nav))
    written = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md") if "screenshots" not in path.parts}
    assert written <= listed, written - listed
