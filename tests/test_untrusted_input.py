"""Untrusted input and run state: crafted or corrupted checkpoints, torn logs, signals, non-finite metrics,
paths built from names, and the validation holes a hostile or careless user finds. Each case ends in a clear
one-line error (exit 2 for input, 3 for an unusable run state), never a traceback, never code execution."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner, Result

from conftest import ConfigFactory
from graphfed import cli
from graphfed.config import dump_config
from graphfed.sim import checkpoint as io_module
from graphfed.sim.checkpoint import CHECKPOINT, CHECKPOINT_MAGIC, CheckpointError, load_checkpoint

runner = CliRunner()


def invoke(*args: str | Path) -> Result:
    return runner.invoke(cli.app, [str(a) for a in args])


def one_error_line(result: Result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def finished(make_config: ConfigFactory, tmp_path: Path) -> tuple[Path, Path]:
    """A finished tiny run (config file, run directory with a checkpoint)."""
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(make_config("ditto", "train.rounds=4", "train.eval_every=2",
                                              "train.checkpoint_every=2")))
    out = tmp_path / "run"
    assert invoke("run", config, "--out", out, "--no-progress").exit_code == 0
    return config, out


def write_payload(out: Path, payload: bytes, checksum: bool = True) -> None:
    header = CHECKPOINT_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" if checksum else b""
    (out / CHECKPOINT).write_bytes(header + payload)


class _Exploit:
    """Unpickling this would create a marker file (what an attacker's checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("with_checksum", [True, False])
def test_a_crafted_checkpoint_runs_no_code_and_fails_in_one_line(finished: tuple[Path, Path], tmp_path: Path,
                                                                 with_checksum: bool) -> None:
    """A checkpoint whose unpickling would create a marker file: --resume leaves no marker, exits 3, one line
    (with a valid checksum too: the checksum is about corruption, weights_only=True is about code)."""
    config, out = finished
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"completed_rounds": 2, "payload": _Exploit(marker)}, buffer)
    assert b"touch" in buffer.getvalue()  # the payload really carries the call
    write_payload(out, buffer.getvalue(), with_checksum)
    result = invoke("run", config, "--out", out, "--resume", "--no-progress")
    assert not marker.exists()
    assert result.exit_code == 3
    assert "not a readable graphfed checkpoint" in one_error_line(result)


def test_a_bit_flip_in_the_checkpoint_is_refused_by_its_checksum(finished: tuple[Path, Path]) -> None:
    config, out = finished
    data = bytearray((out / CHECKPOINT).read_bytes())
    data[-100] ^= 0x01
    (out / CHECKPOINT).write_bytes(bytes(data))
    result = invoke("run", config, "--out", out, "--resume", "--no-progress")
    assert result.exit_code == 3
    assert "corrupt" in one_error_line(result) and "checksum" in one_error_line(result)


def _state(out: Path) -> dict[str, Any]:
    return load_checkpoint(out)


@pytest.mark.parametrize(("case", "message"), [
    ("dict", "no valid 'completed_rounds'"),
    ("list", "holds a list"),
    ("wrong_shapes", "does not fit"),
    ("bad_rng", "does not fit"),
    ("client_state", "does not fit"),
    ("rounds", "claims 99 completed rounds"),
])
def test_a_valid_pickle_of_the_wrong_structure_gives_one_line(finished: tuple[Path, Path], case: str,
                                                              message: str) -> None:
    config, out = finished
    state: Any = _state(out)
    if case == "dict":
        state = {"foo": 1}
    elif case == "list":
        state = [1, 2, 3]
    elif case == "wrong_shapes":
        state["method"]["global_weights"] = torch.zeros(3)
    elif case == "bad_rng":
        state["torch_rng"] = torch.zeros(5, dtype=torch.uint8)
    elif case == "client_state":
        state["clients"] = {"trained": torch.zeros(2, dtype=torch.bool), "tensors": {}}
    elif case == "rounds":
        state["completed_rounds"] = 99
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_payload(out, buffer.getvalue())
    result = invoke("run", config, "--out", out, "--resume", "--no-progress")
    assert result.exit_code == 3, result.output
    assert message in one_error_line(result)


def test_a_plain_pickle_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT).write_bytes(pickle.dumps({"completed_rounds": 1}))
    with pytest.raises(CheckpointError, match="not a readable graphfed checkpoint"):
        load_checkpoint(tmp_path)


def test_checkpoints_carry_a_checksum_header(finished: tuple[Path, Path]) -> None:
    _, out = finished
    data = (out / CHECKPOINT).read_bytes()
    header, _, payload = data.partition(b"\n")
    assert header.startswith(CHECKPOINT_MAGIC)
    assert header[len(CHECKPOINT_MAGIC):].decode() == hashlib.sha256(payload).hexdigest()
    assert io_module.load_checkpoint(out)["completed_rounds"] == 4


def test_summary_json_is_valid_json(finished: tuple[Path, Path]) -> None:
    _, out = finished
    json.loads((out / "summary.json").read_text(), parse_constant=lambda name: pytest.fail(f"{name} in JSON"))


# ---- names that become paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["../../x", "/abs/path", "..", ".hidden", "a/b", "x\ny", "a\\b", ""])
@pytest.mark.parametrize("where", ["dataset", "method", "variant"])
def test_suite_names_that_would_leave_the_output_folder_are_refused(tmp_path: Path, key: str, where: str) -> None:
    """Suite keys become folder names: anything with a separator, a leading dot or a control character is
    refused before anything runs, and nothing is written anywhere (inside --out or outside it)."""
    import yaml

    from graphfed.cli import app

    entry: dict[str, Any] = {"methods": ["fedavg"], "config": {"dataset": {"name": "fln", "num_clients": 4}}}
    dataset_key = "ok"
    if where == "dataset":
        dataset_key = key
    elif where == "method":
        entry["methods"] = [key]
    else:
        entry["methods"] = [key]
        entry["variants"] = {key: {"method": "fedavg"}}
    suite = tmp_path / "suite" / "s.yaml"
    suite.parent.mkdir()
    suite.write_text(yaml.safe_dump({"name": "x", "datasets": {dataset_key: entry}}))
    before = sorted(p for p in tmp_path.rglob("*"))
    result = CliRunner().invoke(app, ["bench", str(suite), "--out", str(tmp_path / "out" / "deep")])
    assert result.exit_code == 2, result.output
    assert "cannot name a folder" in one_error_line(result) or "at least 1" in one_error_line(result)
    assert sorted(p for p in tmp_path.rglob("*")) == before


# ---- run state -------------------------------------------------------------------------------------------


def test_a_torn_last_line_of_rounds_jsonl_is_dropped_on_resume(finished: tuple[Path, Path]) -> None:
    """A crash mid-append leaves a partial last line: resume drops it and finishes; the log is whole again."""
    config, out = finished
    log = out / "rounds.jsonl"
    whole = log.read_text()
    log.write_text(whole + '{"round": 5, "val_me')
    result = invoke("run", config, "--out", out, "--resume", "--no-progress")
    assert result.exit_code == 0, result.output
    assert log.read_text() == whole


def test_a_corrupt_line_inside_rounds_jsonl_is_named(finished: tuple[Path, Path]) -> None:
    config, out = finished
    log = out / "rounds.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], "garbage{", *lines[1:]]) + "\n")
    result = invoke("run", config, "--out", out, "--resume", "--no-progress")
    assert result.exit_code == 3
    line = one_error_line(result)
    assert "rounds.jsonl: line 2 is not JSON" in line


def test_temporary_files_of_interrupted_writes_are_cleaned(finished: tuple[Path, Path]) -> None:
    config, out = finished
    stale = [out / ".checkpoint.pt.k3j2.tmp", out / "graphs" / ".round_0002.npz.x1.tmp"]
    for path in stale:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"half a file")
    assert invoke("run", config, "--out", out, "--resume", "--no-progress").exit_code == 0
    assert not any(path.exists() for path in stale)


def test_sigterm_ends_a_run_like_ctrl_c(make_config: ConfigFactory, tmp_path: Path) -> None:
    """SIGTERM: exit 130, the same one-line message as Ctrl-C, the last checkpoint kept and resumable."""
    import os
    import signal
    import subprocess
    import sys
    import time

    config = tmp_path / "long.yaml"
    config.write_text(dump_config(make_config("fedavg", "train.rounds=100000", "train.checkpoint_every=5",
                                              "train.eval_every=50")))
    out = tmp_path / "run"
    executable = Path(sys.executable).parent / "graphfed"
    process = subprocess.Popen([str(executable), "run", str(config), "--out", str(out), "--no-progress"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / CHECKPOINT).exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted; the last checkpoint" in stderr.strip().splitlines()[-1]
    assert load_checkpoint(out)["completed_rounds"] >= 5


def test_a_client_whose_metric_is_infinite_is_named_and_the_summary_stays_json(tmp_path: Path) -> None:
    """One client's test targets overflow the squared error in float32 (1e20 is finite, its square is not):
    the run completes, the client is named in test_nonfinite_clients, test_mean is over the others, and
    summary.json / rounds.jsonl are strict JSON (no Infinity)."""
    import numpy as np

    from graphfed.data.datasets.folder import write_federation

    rng = np.random.default_rng(0)

    def split(rows: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        x = rng.normal(size=(rows, 3)).astype(np.float32)
        return x, (x.sum(1, keepdims=True) * scale).astype(np.float32)

    clients = {f"c{i}": {"train": split(20), "val": split(5), "test": split(5, 1e20 if i == 1 else 1.0)}
               for i in range(3)}
    folder = write_federation(tmp_path / "fed", clients)
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{name: folder, data_dir: {folder}}}\nmethod: {{name: fedavg}}\n"
                      "train: {rounds: 2, eval_every: 1, local_steps: 2, batch_size: 4, clients_per_round: 3}\n")
    out = tmp_path / "run"
    result = invoke("run", config, "--out", out, "--no-progress")
    assert result.exit_code == 0, result.output
    strict = {"parse_constant": lambda name: pytest.fail(f"{name} in JSON")}
    summary = json.loads((out / "summary.json").read_text(), **strict)
    assert summary["test_nonfinite_clients"] == ["c1"]
    assert summary["test_mean"] is not None and summary["test_mean"] < 1e3
    for line in (out / "rounds.jsonl").read_text().splitlines():
        json.loads(line, **strict)
