"""The wheel is the product: what ``pip install graphfed`` gives in a fresh environment must work.

Builds graphfed's sdist and wheel (the wheel from the sdist, so a file the sdist forgets fails here), then for each
resolution installs the wheel into a fresh virtual environment with only its declared dependencies, resolved anew:

* ``newest``: pip, the newest release each bound allows (torch first, as the README says: the CPU wheel);
* ``lowest``: uv's ``--resolution lowest-direct``, the lowest release each direct dependency's bound allows.

From a folder outside the clone it then runs the README's tour in small (``list``, ``describe``, ``run`` of the
packaged demo, ``show``, ``compare``), the README's library snippet (taken from README.md itself), and the mistakes
that must be one line and exit 2 (``--out`` a file, FedBN on a model without BatchNorm, the Flower engine without
its extra). The two environments are built side by side.

    .venv/bin/python tools/check_wheel.py                 # both resolutions (make test runs this)
    .venv/bin/python tools/check_wheel.py --only lowest   # one
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # the CPU wheel the README installs first; never a CUDA build
RESOLUTIONS = ("newest", "lowest")


class CheckFailed(Exception):
    pass


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None, expect: int = 0,
        log: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)
    if log is not None:
        log.append(f"$ {' '.join(command)}  -> {completed.returncode}")
    if completed.returncode != expect:
        raise CheckFailed(f"{' '.join(command)} exited {completed.returncode} (expected {expect}):\n"
                          f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}")
    return completed


def build(out: Path) -> Path:
    """sdist, then the wheel built from it; returns the wheel."""
    run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)], ROOT)
    wheels = sorted(out.glob("graphfed-*.whl"))
    if len(wheels) != 1 or not sorted(out.glob("graphfed-*.tar.gz")):
        raise CheckFailed(f"build made {[p.name for p in out.iterdir()]}, one wheel and one sdist expected")
    return wheels[0]


def uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if found is None:
        raise CheckFailed("uv is not installed (pip install uv): it resolves the lowest versions")
    return found


def install(resolution: str, wheel: Path, venv: Path, log: list[str]) -> None:
    run([sys.executable, "-m", "venv", str(venv)], ROOT, log=log)
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "--quiet", TORCH], ROOT, log=log)
    if resolution == "newest":
        run([python, "-m", "pip", "install", "--quiet", str(wheel)], ROOT, log=log)
        return
    constraints = venv / "torch-constraint.txt"
    constraints.write_text(TORCH + "\n")  # keep the CPU build installed above (a range would fetch a CUDA one)
    # the wheel's own requirements named on the command line are direct ones: uv takes the lowest each bound allows
    run([uv(), "pip", "install", "--quiet", "--python", python, "--resolution", "lowest-direct",
         "--constraint", str(constraints), str(wheel), *declared_requirements(wheel)], ROOT, log=log)


def declared_requirements(wheel: Path) -> list[str]:
    """The base install's requirements, as the wheel's metadata declares them (extras left out)."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


def readme_snippet() -> str:
    """The README's library snippet: its first python block that calls run_config."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    for block in blocks:
        if "run_config(" in block and "register_" not in block:
            return block
    raise CheckFailed("README.md has no python block calling run_config (the library snippet)")


def one_line_exit_2(completed: subprocess.CompletedProcess[str], needle: str) -> None:
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    if len(lines) != 1 or needle not in lines[0] or "bug in graphfed" in completed.stderr:
        raise CheckFailed(f"expected one line naming {needle!r}, got:\n{completed.stderr}")


def exercise(venv: Path, work: Path, log: list[str]) -> None:
    """What a user does first, from outside the clone, with only the installed package."""
    graphfed = str(venv / "bin" / "graphfed")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHONPATH", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    small = ["--set", "train.rounds=2", "--set", "train.eval_every=1", "--set", "train.local_steps=2"]
    run([graphfed, "--help"], work, env, log=log)
    version = run([graphfed, "--version"], work, env, log=log)
    if not version.stdout.startswith("graphfed ") or "unknown" in version.stdout:
        raise CheckFailed(f"graphfed --version printed {version.stdout!r}")
    plan = run([graphfed, "bench", "smoke", "--out", "runs/smoke", "--plan"], work, env, log=log)  # a suite by name
    if "smoke" not in plan.stdout or (work / "runs" / "smoke").exists():
        raise CheckFailed("graphfed bench smoke --plan did not plan the packaged suite (or wrote something)")
    listing = run([graphfed, "list"], work, env, log=log)
    if "panacea" not in listing.stdout:
        raise CheckFailed("graphfed list does not name panacea")
    run([graphfed, "describe", "ditto"], work, env, log=log)
    run([graphfed, "run", "demo", *small, "--out", "runs/panacea", "--no-progress"], work, env, log=log)
    if not (work / "runs" / "panacea" / "summary.json").is_file():
        raise CheckFailed("graphfed run wrote no summary.json")
    run([graphfed, "show", "runs/panacea"], work, env, log=log)
    run([graphfed, "compare", "demo", "--methods", "panacea,fedavg", "--seeds", "2", *small, "--out", "runs/cmp",
         "--no-progress"], work, env, log=log)
    snippet = readme_snippet().replace("train.rounds=50", "train.rounds=2")
    run([str(venv / "bin" / "python"), "-c", snippet], work, env, log=log)
    (work / "a-file").write_text("not a folder")
    one_line_exit_2(run([graphfed, "run", "demo", "--out", "a-file"], work, env, expect=2, log=log),
                    "--out a-file: exists and is not a directory")
    one_line_exit_2(run([graphfed, "run", "demo", "--set", "method.name=fedbn", "--out", "runs/fedbn"], work, env,
                        expect=2, log=log), "BatchNorm")
    one_line_exit_2(run([graphfed, "flower-app", "demo", "--out", "app"], work, env, expect=2, log=log),
                    "graphfed[flower]")


def check(resolution: str, wheel: Path, scratch: Path) -> tuple[str, float, list[str]]:
    started = time.perf_counter()
    log: list[str] = []
    venv, work = scratch / f"venv-{resolution}", scratch / f"work-{resolution}"
    work.mkdir()
    install(resolution, wheel, venv, log)
    versions = run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"], ROOT).stdout
    picked = [line for line in versions.splitlines()
              if line.split("==")[0].lower() in ("typer", "click", "numpy", "scipy", "pydantic", "torch",
                                                  "torch_geometric", "torch-geometric", "matplotlib", "rich")]
    log.append("installed: " + ", ".join(picked))
    exercise(venv, work, log)
    return resolution, time.perf_counter() - started, log


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=RESOLUTIONS)
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (printed)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="graphfed-wheel-"))
    try:
        wheel = build(scratch / "dist")
        chosen = [args.only] if args.only else list(RESOLUTIONS)
        with ThreadPoolExecutor(len(chosen)) as pool:
            futures = {resolution: pool.submit(check, resolution, wheel, scratch) for resolution in chosen}
            failures = 0
            for resolution, future in futures.items():
                try:
                    _, seconds, log = future.result()
                    print(f"wheel check ({resolution}): ok in {seconds:.0f} s")
                    print("  " + "\n  ".join(log))
                except CheckFailed as failure:
                    failures += 1
                    print(f"wheel check ({resolution}) failed: {failure}", file=sys.stderr)
        return 1 if failures else 0
    finally:
        if args.keep:
            print(f"scratch kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
