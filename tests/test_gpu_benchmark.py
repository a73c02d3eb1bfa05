"""``benchmarks/gpu.py`` cannot rot where no GPU is at hand: without CUDA it says so in one line and exits 0, and
``--device cpu --quick`` runs a shrunken version of every part whose numbers must hold together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu.py"


def test_without_cuda_the_gpu_benchmark_says_so_and_exits_0(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        return  # a GPU machine runs the real benchmark; the line below is about machines without one
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("no cuda device here, nothing measured")
    assert not out.exists()


@pytest.mark.slow
def test_the_quick_cpu_run_measures_parity_throughput_and_projection(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--repeats", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["quick"] is True
    # CPU against CPU: every field agrees (the same numbers, bit for bit, on one device)
    assert [row["method"] for row in result["parity"]] == ["fedavg", "panacea", "fedaghn"]
    assert all(row["ok"] and row["cpu_test_mean"] == row["device_test_mean"] for row in result["parity"])
    assert all(row["first_round_relative_difference"] == 0.0 for row in result["parity"])
    for name in ("lenet-cifar10", "pfl-cifar10"):
        cell = result["throughput"][name]
        assert set(cell["best_seconds"]) == {"graphfed", "loop", "floor"}
        assert cell["graphfed_over_loop"] == cell["best_seconds"]["loop"] / cell["best_seconds"]["graphfed"]
    (row,) = result["projection"]
    assert row["section"] == "panacea-metr-la" and row["rounds"] == 800
    assert row["projected_minutes"] == (row["first_round_seconds"] + row["seconds_per_round"] * 799) / 60 > 0
    assert result["code"]["code_id"]
    (row,) = result["determinism"]  # on the CPU both modes repeat exactly; bf16 autocast changes the numbers
    assert row["method"] == "fedbn" and row["deterministic_repeat_equal"] and row["default_repeat_equal"]
    assert row["bf16_test_mean"] != row["fp32_test_mean"]
    (row,) = result["host_rows"]  # rows read from host memory: the very numbers of rows on the device
    assert row["method"] == "fedavg" and row["equal"] and row["differing_fields"] == []
    # the profiled rounds: their op tables beside the JSON, and what the CPU ran (no kernel launches here)
    assert [row["workload"] for row in result["profile"]] == ["pfl-cifar10", "panacea-metr-la"]
    assert all(row["aten_ops"] > 100 and row["kernel_launches"] == 0 for row in result["profile"])
    assert "aten::" in (tmp_path / "profile-pfl-cifar10.txt").read_text()
    assert "sensitivity" not in result  # CPU-only, asked for by name
    # the step against the floor at each precision: one FLOP count over each measured time, the same yardstick
    assert [row["precision"] for row in result["floor"]] == ["fp32", "tf32", "bf16"]
    for row in result["floor"]:
        steps = row["step_seconds"]
        assert row["graphfed_over_floor"] == steps["graphfed"] / min(steps["floor"], steps["floor_channels_last"])
        images = row["clients"] * row["batch"]
        assert row["tflops"]["graphfed"] == row["flop_per_image"] * images / steps["graphfed"] / 1e12 > 0
        assert row["flop_per_image"] > 1e5 and row["peak"]["matmul_tflops"] > 0 and row["peak"]["copy_gbps"] > 0
        # every batched kernel of CNN-BN timed against the same floor; on a CPU the run's own choice is the loop
        assert set(row["kernel_over_floor"]) == {"vmap", "grouped", "unfold"}
        assert row["kernel_over_floor"]["unfold"] == steps["graphfed[unfold]"] / min(steps["floor"],
                                                                                     steps["floor_channels_last"])
        assert row["conv_kernel"]["conv_kernel"] == "loop" and row["clients_per_chunk"] == 1
    # packs of FedAGHN's CIFAR-10 section (steady rounds without evaluation): S = 1 is the sequential reference,
    # S = 2 its packed ratio
    assert [row["runs"] for row in result["pack"]] == [1, 2]
    single, packed = result["pack"]
    assert single["over_sequential"] == 1.0 and packed["runs_per_hour"] > 0
    assert packed["over_sequential"] == packed["runs_per_hour"] / single["runs_per_hour"]


def test_rounding_sensitivity_tells_a_rounding_amplifier_from_a_stable_method(tmp_path: Path) -> None:
    """Half an ulp of error in every op's result moves one round of FedAvg's tiny MLP config by rounding's own size
    and one of FLHA-GHN's (deep width-4 networks with BatchNorm over a few rows) by orders of magnitude more: the
    yardstick against which ``parity`` judges a GPU's differing summaries."""
    out = tmp_path / "sensitivity.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--parts", "sensitivity", "--methods",
                           "fedavg,flha-ghn", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    values = {row["method"]: row["rounding_sensitivity"] for row in json.loads(out.read_text())["sensitivity"]}
    assert 0 < values["fedavg"] < 1e-5 and values["flha-ghn"] > 1e-4
