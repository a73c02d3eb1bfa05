"""Tiny seeded runs of every method whose exact numbers pin behaviour across refactors.

``python tests/golden_runs.py write`` records them in ``tests/data/golden_runs.json`` (run it on the commit whose
numbers are the reference); ``tests/test_golden_runs.py`` re-runs them and compares.

The runs go through kernels that MKL, oneDNN and ATen choose by the CPU's instruction set, whose last bits differ,
and a 4-round run on a few hundred images amplifies them: on one Xeon, FLHA-GHN's test mean is 0.352 with AVX-512,
0.431 with MKL held to its AVX2 path (the one AMD CPUs take) and 0.449 with oneDNN held to AVX2 too, all from the
same code. So each run is computed in a subprocess on **portable kernels** (:data:`PORTABLE_KERNELS`), whose
numbers do not depend on which x86-64 CPU runs them:

* MKL in Conditional Numerical Reproducibility mode ``COMPATIBLE``: Intel documents the same results on every Intel
  and compatible x86-64 processor at a fixed thread count (the runs use one thread);
* ATen's ``default`` kernels: one compiled code path, not the one vectorised for this CPU;
* oneDNN off (``torch.backends.mkldnn.enabled = False``): its just-in-time kernels are picked per instruction set
  and cache size; convolutions then run ATen's own (im2col and MKL's product).

On one Sapphire Rapids Xeon every method's numbers are the same with MKL held to AVX2, oneDNN held to AVX2 and
glibc's FMA variants off (``make test`` re-runs the convolutional ones under MKL's AVX2 path). Each method holds a
list of *outcomes*, one per architecture (x86-64 here; an aarch64 machine has no MKL and records its own with
``python tests/golden_runs.py add [METHOD...]``, never to hide a change); ``write`` starts the file afresh (for a
change meant to move numbers, said so in its commit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "data" / "golden_runs.json"
BASE: dict[str, Any] = {
    "seed": 3, "torch_threads": 1,
    "dataset": {"name": "digits", "num_clients": 6, "novel_fraction": 0.0},
    "model": {"name": "mlp", "options": {"hidden": 16}},
    "train": {"rounds": 4, "clients_per_round": 4, "local_steps": 5, "batch_size": 16, "lr": 0.1, "eval_every": 2,
              "checkpoint_every": 4, "autotune": False},
}
#: a few hundred MNIST rows (from ../shared/data) for the image models
IMAGES: dict[str, Any] = {"name": "mnist", "num_clients": 4, "client_fraction": 0.01}
#: configs that differ from BASE (method name -> overrides)
SPECIAL: dict[str, dict[str, Any]] = {
    "panacea": {"dataset": {"name": "fl60", "novel_fraction": 0.2}, "train": {"novel_adapt_rounds": 2},
                "method": {"options": {"embedding_dim": 4, "gnn_hidden": 8, "hypernet_hidden": 8, "server_steps": 2}}},
    "pfedgat": {"method": {"options": {"feedback": "loss_only"}}},
    # a federation where MOON's contrastive term moves the numbers (on the digits base every mu and temperature gave
    # FedAvg's), with a temperature other than the default, so a temperature that never reaches training shows
    "moon": {"dataset": {"name": "fln", "num_clients": 12, "novel_fraction": 0.0},
             "model": {"name": "mlp", "options": {"hidden": 8}}, "train": {"rounds": 8},
             "method": {"options": {"mu": 5.0, "temperature": 0.1}}},
    "fedpac": {"model": {"name": "cnn-bn", "options": {}}, "dataset": IMAGES},
    "fedbn": {"model": {"name": "cnn-bn", "options": {}}, "dataset": IMAGES},
    "flha-ghn": {"model": {"name": "resnet-like", "options": {"width": 4}, "architectures": ["arch0", "arch1"]},
                 "dataset": IMAGES},
    "flha-distill": {"method": {"options": {"distill_steps": 10}},
                     "model": {"name": "resnet-like", "options": {"width": 4}, "architectures": ["arch0", "arch1"]},
                     "dataset": IMAGES},
}
#: the environment of a golden run's subprocess (see the module's docstring; oneDNN is switched off inside it)
PORTABLE_KERNELS = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"}
KEYS = ("test_mean", "val_mean", "test_std", "best_round", "final_test_mean", "novel_mean", "novel_adapted_mean",
        "bytes_up", "bytes_down", "num_params")


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        # a dataset is replaced whole (another dataset's fields may not apply); other sections merge
        out[key] = merged(base.get(key, {}), value) if isinstance(value, dict) and key in ("train",) else value
    return out


def config_of(method: str) -> dict[str, Any]:
    special = SPECIAL.get(method, {})
    config = merged(BASE, {k: v for k, v in special.items() if k != "method"})
    config["method"] = {"name": method, **special.get("method", {})}
    return config


def numbers(method: str) -> dict[str, Any]:
    """``method``'s golden run on portable kernels, in a subprocess (MKL and ATen read their settings when they
    load, before this process could change them)."""
    done = subprocess.run([sys.executable, __file__, "numbers", method], env={**os.environ, **PORTABLE_KERNELS},
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the golden run of {method} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def numbers_here(method: str) -> dict[str, Any]:
    """``method``'s golden run in this process, which must have been started with :data:`PORTABLE_KERNELS`."""
    import torch

    assert all(os.environ.get(name) == value for name, value in PORTABLE_KERNELS.items()), "not on portable kernels"
    torch.backends.mkldnn.enabled = False
    from graphfed.config import validate_config
    from graphfed.sim.engine import run_config

    result = run_config(validate_config(config_of(method)), None, progress=False)
    return {key: getattr(result, key) for key in KEYS}


def methods() -> list[str]:
    from graphfed.methods import METHODS

    return sorted(METHODS)


def cpu_path() -> str:
    """Which machine recorded an outcome (a label for people; outcomes are matched by their numbers)."""
    import platform

    import torch

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else \
        platform.processor()
    return f"{platform.machine()} portable kernels, recorded on {model}, torch {torch.__version__}"


def matches(got: dict[str, Any], outcome: dict[str, Any]) -> bool:
    """Equal to 1e-6 relative on floats (summation order inside one kernel), exactly on everything else."""
    import math

    for key in KEYS:
        value = outcome[key]
        if isinstance(value, float):
            if not isinstance(got[key], float) or not math.isclose(got[key], value, rel_tol=1e-6, abs_tol=1e-9):
                return False
        elif got[key] != value:
            return False
    return True


if __name__ == "__main__" and sys.argv[1:2] == ["numbers"]:
    print(json.dumps(numbers_here(sys.argv[2])))
elif __name__ == "__main__" and sys.argv[1:2] in (["write"], ["add"]):
    import time

    fresh = sys.argv[1] == "write"
    recorded: dict[str, list[dict[str, Any]]] = {} if fresh else json.loads(GOLDEN.read_text())
    for name in sys.argv[2:] or methods():
        begin = time.perf_counter()
        got = numbers(name)
        outcomes = recorded.setdefault(name, [])
        known = any(matches(got, outcome) for outcome in outcomes)
        if not known:
            outcomes.append({"cpu": cpu_path(), **got})
        print(f"{name}: {time.perf_counter() - begin:.1f} s{'' if known else ' (new outcome)'}", flush=True)
    GOLDEN.write_text(json.dumps(recorded, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
