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
from graphfed.sim import checkpoint
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


@pytest.fixture
def crashed(finished: tuple[Path, Path]) -> tuple[Path, Path]:
    """A tiny run whose process died after its last checkpoint, before its summary (a finished run has nothing to
    resume)."""
    (finished[1] / "summary.json").unlink()
    return finished


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
    assert checkpoint.load_checkpoint(out)["completed_rounds"] == 4


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


def test_a_torn_last_line_of_rounds_jsonl_is_dropped_on_resume(crashed: tuple[Path, Path]) -> None:
    """A crash mid-append leaves a partial last line: resume drops it and finishes; the log is whole again."""
    config, out = crashed
    log = out / "rounds.jsonl"
    whole = log.read_text()
    log.write_text(whole + '{"round": 5, "val_me')
    result = invoke("run", config, "--out", out, "--resume", "--no-progress")
    assert result.exit_code == 0, result.output
    assert log.read_text() == whole


def test_a_corrupt_line_inside_rounds_jsonl_is_named(crashed: tuple[Path, Path]) -> None:
    config, out = crashed
    log = out / "rounds.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], "garbage{", *lines[1:]]) + "\n")
    result = invoke("run", config, "--out", out, "--resume", "--no-progress")
    assert result.exit_code == 3
    line = one_error_line(result)
    assert "rounds.jsonl: line 2 is not JSON" in line


def test_temporary_files_of_interrupted_writes_are_cleaned(crashed: tuple[Path, Path]) -> None:
    config, out = crashed
    stale = [out / ".checkpoint.pt.k3j2.tmp", out / "graphs" / ".round_0002.npz.x1.tmp"]
    for path in stale:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"half a file")
    assert invoke("run", config, "--out", out, "--resume", "--no-progress").exit_code == 0
    assert not any(path.exists() for path in stale)


@pytest.mark.parametrize(("mechanism", "signals"), [("none", ["SIGTERM"]), ("local", ["SIGINT", "SIGINT"]),
                                                   ("central", ["SIGINT", "SIGINT"])])
def test_a_signal_ends_every_mechanisms_run_as_an_interrupt(make_config: ConfigFactory, tmp_path: Path,
                                                            mechanism: str, signals: list[str]) -> None:
    """SIGTERM, or Ctrl-C twice in quick succession (the second while the first is being recorded): exit 130, the
    same one-line message, the run's status ``interrupted`` (graphfed status says so), the checkpoint kept and
    resumable, under every privacy mechanism."""
    import os
    import signal
    import subprocess
    import sys
    import time

    private = [] if mechanism == "none" else [f"privacy.mechanism={mechanism}", "privacy.noise_multiplier=1.0"]
    config = tmp_path / "long.yaml"
    config.write_text(dump_config(make_config("fedavg", "train.rounds=100000", "train.checkpoint_every=5",
                                              "train.eval_every=50", *private)))
    out = tmp_path / "run"
    executable = Path(sys.executable).parent / "graphfed"
    process = subprocess.Popen([str(executable), "run", str(config), "--out", str(out), "--no-progress"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / CHECKPOINT).exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    for name in signals:
        os.kill(process.pid, getattr(signal, name))
        time.sleep(0.02)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted; the last checkpoint" in stderr.strip().splitlines()[-1]
    # every 5 rounds (train.checkpoint_every), a private run's after every round
    assert load_checkpoint(out)["completed_rounds"] >= (5 if mechanism == "none" else 1)
    assert json.loads((out / "status.json").read_text())["state"] == "interrupted"
    assert invoke("status", out).exit_code == 130


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


# ---- validation holes: configs ---------------------------------------------------------------------------


@pytest.fixture
def demo_config(make_config: ConfigFactory, tmp_path: Path) -> Path:
    path = tmp_path / "demo.yaml"
    path.write_text(dump_config(make_config("fedavg", "train.rounds=2")))
    return path


@pytest.mark.parametrize(("overrides", "field"), [
    (["model.options.hidden=-1"], "model.options.hidden"),
    (["model.options.hidden=0"], "model.options.hidden"),
    (["model.options.num_layers=0"], "model.options.num_layers"),
    (["model.options.hiden=8"], "model.options.hiden"),
    (["seed=-1"], "seed"),
    (["train.rounds=true"], "train.rounds"),
    (["train.batch_size=100000000"], "train.batch_size"),
])
def test_bad_values_exit_2_naming_the_field(demo_config: Path, tmp_path: Path, overrides: list[str],
                                           field: str) -> None:
    sets = [arg for text in overrides for arg in ("--set", text)]
    result = invoke("run", demo_config, *sets, "--out", tmp_path / "out", "--no-progress")
    assert result.exit_code == 2, result.output
    assert one_error_line(result).startswith(f"error: {field}")


@pytest.mark.parametrize(("content", "message"), [
    (b"train: {rounds: 3\n", "not valid YAML"),
    (b"\xff\xfetrain: 1\n", "not UTF-8"),
    (b"train: {rounds: *undefined}\n", "not valid YAML"),
])
def test_broken_config_files_exit_2_naming_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_bytes(content)
    result = invoke("run", path, "--out", tmp_path / "out", "--no-progress")
    assert result.exit_code == 2
    line = one_error_line(result)
    assert str(path) in line and message in line


def test_empty_methods_and_unusable_out_are_refused_before_any_data_is_built(demo_config: Path,
                                                                             tmp_path: Path) -> None:
    empty = invoke("compare", demo_config, "--methods", "", "--out", tmp_path / "cmp")
    assert empty.exit_code == 2 and "--methods" in one_error_line(empty)
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    for args in (["run", demo_config], ["compare", demo_config, "--methods", "fedavg"]):
        result = invoke(*args, "--out", a_file, "--no-progress")
        assert result.exit_code == 2 and "not a directory" in one_error_line(result)
    under_a_file = invoke("run", demo_config, "--out", a_file / "run", "--no-progress")
    assert under_a_file.exit_code == 2 and "not a writable directory" in one_error_line(under_a_file)
    assert a_file.read_text() == "not a folder"


def test_more_clients_per_round_than_clients_is_recorded(make_config: ConfigFactory,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    from graphfed.sim.engine import run_config

    summary = run_config(make_config("fedavg", "train.clients_per_round=500", "train.rounds=2"), progress=False)
    assert summary.clients_per_round == 12
    assert "train.clients_per_round is 500 but only 12 clients train" in caplog.text


# ---- validation holes: data files ------------------------------------------------------------------------


def _folder(tmp_path: Path, mutate: Any = None, regression: bool = False) -> Path:
    """A small valid federation folder; ``mutate(clients)`` edits the arrays before writing."""
    import numpy as np

    from graphfed.data.datasets.folder import write_federation

    rng = np.random.default_rng(0)

    def split(rows: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.normal(size=(rows, 3))
        y = x.sum(1, keepdims=True) if regression else rng.integers(0, 3, rows)
        return x, y

    clients = {f"c{i}": {"train": split(12), "val": split(4), "test": split(4)} for i in range(3)}
    if mutate is not None:
        mutate(clients)
    return write_federation(tmp_path / "fed", clients)


def _run_folder(folder: Path, tmp_path: Path) -> Result:
    config = tmp_path / "folder.yaml"
    config.write_text(f"dataset: {{name: folder, data_dir: '{folder}'}}\nmethod: {{name: fedavg}}\n"
                      "train: {rounds: 1, local_steps: 1, batch_size: 4, clients_per_round: 2}\n")
    out = tmp_path / "out"
    result = invoke("run", config, "--out", out, "--no-progress")
    assert not out.exists()  # nothing written for bad input
    return result


def _huge_header_npz(path: Path) -> None:
    """An .npz whose x claims 10^12 rows but stores a few bytes (numpy would try to allocate 12 TB)."""
    import zipfile

    import numpy as np

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 3)})
    y = io.BytesIO()
    np.save(y, np.zeros(4, dtype=np.int64))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", header.getvalue() + b"\0" * 48)
        archive.writestr("y.npy", y.getvalue())


@pytest.mark.parametrize(("case", "message"), [
    ("huge_header", "claims shape (1000000000000, 3)"),
    ("huge_label", "label 1000000000 means 1,000,000,001 classes"),
    ("target_beyond_float32", "beyond float32's range"),
    ("graph_weight_beyond_float32", "weight must be finite and > 0"),
    ("zero_width_features", "no features"),
    ("zero_width_targets", "no targets"),
    ("non_utf8_csv", "cannot be read as CSV"),
    ("control_characters", "must not hold control characters"),
])
def test_broken_federation_files_exit_2_with_one_line_naming_the_file(tmp_path: Path, case: str,
                                                                      message: str) -> None:
    import numpy as np

    named = ""
    if case == "huge_header":
        folder = _folder(tmp_path)
        _huge_header_npz(folder / "clients" / "c1" / "val.npz")
        named = "c1/val.npz"
    elif case == "huge_label":
        folder = _folder(tmp_path, lambda c: c["c2"]["test"][1].__setitem__(0, 10**9))
        named = "c2/test.npz"
    elif case == "target_beyond_float32":
        folder = _folder(tmp_path, lambda c: c["c0"]["train"][1].__setitem__((3, 0), 1e300), regression=True)
        named = "c0/train.npz"
    elif case == "graph_weight_beyond_float32":
        folder = _folder(tmp_path)
        (folder / "graph.csv").write_text("src,dst,weight\nc0,c1,1e39\n")
        named = "graph.csv"
    elif case == "zero_width_features":
        folder = _folder(tmp_path, lambda c: c["c1"].__setitem__("train", (np.zeros((12, 0)), np.zeros(12, int))))
        named = "c1/train.npz"
    elif case == "zero_width_targets":
        folder = _folder(tmp_path, lambda c: c["c1"].__setitem__("val", (np.zeros((4, 3)), np.zeros((4, 0)))),
                         regression=True)
        named = "c1/val.npz"
    elif case == "non_utf8_csv":
        folder = _folder(tmp_path)
        (folder / "clients" / "c2" / "test.npz").unlink()
        (folder / "clients" / "c2" / "test.csv").write_bytes(b"a,b,c,y\n1,2,3,\xff\n")
        named = "c2/test.csv"
    else:
        folder = _folder(tmp_path)
        (folder / "clients" / "c1").rename(folder / "clients" / "c\x1b[31m1")
        named = "\\x1b[31m"
    result = _run_folder(folder, tmp_path)
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert message in line and named in line
    assert "\x1b" not in result.output


def test_corrupt_metr_la_gzip_names_the_file(tmp_path: Path) -> None:
    import sys

    from graphfed.config import ConfigError, DatasetConfig
    from graphfed.data import build_federation

    sys.path.insert(0, str(Path(__file__).parent))
    from test_metr_la import SPEED_FILE, ramp, write_metr_la

    folder = write_metr_la(tmp_path, ramp())
    data = bytearray((folder / SPEED_FILE).read_bytes())
    for index in range(40, len(data) - 20, 7):
        data[index] ^= 0xA5
    (folder / SPEED_FILE).write_bytes(bytes(data))
    with pytest.raises(ConfigError) as err:
        build_federation(DatasetConfig(name="metr-la-week", data_dir=str(tmp_path)), seed=0)
    assert str(folder / SPEED_FILE) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("counts", [[None], ["3"], [-1], [True]])
def test_femnist_bad_sample_counts_name_the_shard(tmp_path: Path, counts: list[Any]) -> None:
    from graphfed.data.datasets.femnist import read_leaf_shard

    shard = tmp_path / "shard.json"
    shard.write_text(json.dumps({"users": ["w0"], "num_samples": counts,
                                 "user_data": {"w0": {"x": [[0.0] * 784], "y": [1]}}}))
    with pytest.raises(ValueError, match="num_samples") as err:
        read_leaf_shard(shard)
    assert str(shard) in str(err.value)


def test_tpt48_temperatures_beyond_float32_are_refused(tmp_path: Path) -> None:
    import sys

    from graphfed.config import ConfigError, DatasetConfig
    from graphfed.data import build_federation

    sys.path.insert(0, str(Path(__file__).parent))
    from test_datasets import _write_small_tpt48

    folder = _write_small_tpt48(tmp_path, bad_cell="1e308")
    with pytest.raises(ConfigError, match="beyond float32's range") as err:
        build_federation(DatasetConfig(name="tpt48", data_dir=str(tmp_path)), seed=0)
    assert str(folder) in str(err.value)


# ---- a federation that cannot fit ---------------------------------------------------------------------------


def test_a_run_too_large_for_memory_stops_before_allocating(demo_config: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A method whose server state cannot fit in the available memory stops the run before allocating it,
    with exit 2 and one line giving the sizes and what to change."""
    from graphfed.core import memory

    monkeypatch.setattr(memory, "available_memory_bytes", lambda device=None: 2**14)  # a machine with 16 KiB free
    result = invoke("run", demo_config, "--set", "dataset.name=digits", "--set", "dataset.num_clients=10",
                    "--set", "method.name=fedaghn", "--out", tmp_path / "out", "--no-progress")
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert "fedaghn: every client's latest model and update on the server" in line and "GiB is available" in line
    assert "dataset.num_clients" in line and "model.options" in line
    assert not (tmp_path / "out").exists()


def test_a_dense_fl_n_graph_too_large_names_the_sparse_option(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphfed.config import ConfigError, DatasetConfig
    from graphfed.core import memory
    from graphfed.data import build_federation

    build_federation(DatasetConfig(name="fln", num_clients=300, graph_knn=5), seed=0)  # fits anywhere
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device=None: 2**20)
    with pytest.raises(ConfigError, match=r"dense.*needs .* GiB.*use dataset.graph_knn"):
        build_federation(DatasetConfig(name="fln", num_clients=300), seed=0)
