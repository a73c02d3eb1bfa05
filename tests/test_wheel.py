"""The wheel is self-sufficient: built from this tree, installed into a fresh virtualenv (its dependencies, torch
included, borrowed from the project's environment), the README's first run and its library snippet work from an
empty folder, with the packaged configs."""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_snippet() -> str:
    """The README's "Library use" snippet, as printed there."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Library use", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_wheel_runs_the_readme_from_an_empty_folder(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(dist), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("graphfed-*.whl")
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=120)
    python = fresh / "bin" / "python"
    fresh_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies (torch, PyG, flwr...) come from the project's environment, after the fresh site-packages
    (fresh_site / "zz_project_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run([str(python), "-c", "import graphfed; print(graphfed.__file__)"], cwd=empty,
                           capture_output=True, text=True, check=True).stdout
    assert str(fresh_site) in where  # the wheel's graphfed, not the source tree's
    first_run = subprocess.run([str(fresh / "bin" / "graphfed"), "run", "configs/demo_fl60.yaml", "--out",
                                "runs/panacea", "--set", "train.rounds=4", "--set", "train.eval_every=2",
                                "--no-progress"], cwd=empty, capture_output=True, text=True, timeout=300)
    assert first_run.returncode == 0, first_run.stderr
    assert (empty / "runs" / "panacea" / "summary.json").is_file()
    snippet = _readme_snippet().replace('"train.rounds=50"', '"train.rounds=4", "train.eval_every=2"')
    library = subprocess.run([str(python), "-c", snippet], cwd=empty, capture_output=True, text=True, timeout=300)
    assert library.returncode == 0, library.stderr
    test_mean, _ = library.stdout.split()
    assert 0.0 <= float(test_mean) <= 1.0
