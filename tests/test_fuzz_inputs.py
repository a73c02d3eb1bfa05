"""Property-based fuzzing of what users hand graphfed: random bad configs and random broken federation
folders. Whatever hypothesis draws, the CLI answers exit code 2 with one line, no traceback, and writes
nothing to the output directory."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from graphfed import cli
from graphfed.data.datasets.folder import write_federation

runner = CliRunner()
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BASE = {"dataset": {"name": "fln", "num_clients": 4}, "method": {"name": "fedavg"},
        "train": {"rounds": 1, "local_steps": 1, "batch_size": 4, "clients_per_round": 2}}

#: (field, strategy of values that field must refuse)
POSITIVE_INT_FIELDS = ["train.rounds", "train.clients_per_round", "train.local_steps", "train.batch_size",
                       "train.eval_every", "train.checkpoint_every", "dataset.num_clients", "model.options.hidden",
                       "model.options.num_layers"]
not_an_int = st.one_of(st.booleans(), st.text(min_size=1, max_size=8).filter(lambda t: not t.strip().isdigit()),
                       st.floats(allow_nan=True).filter(lambda f: f != int(f) if np.isfinite(f) else True),
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                           max_size=1))
bad_value = st.one_of(
    st.tuples(st.sampled_from(POSITIVE_INT_FIELDS), st.one_of(st.integers(max_value=0), not_an_int)),
    st.tuples(st.sampled_from(["train.lr", "dataset.dirichlet_beta"]),
              st.one_of(st.floats(max_value=0), st.just(float("nan")), st.text(min_size=1, max_size=5))),
    st.tuples(st.sampled_from(["dataset.split"]), st.lists(st.floats(0, 1), max_size=5).filter(
        lambda s: len(s) != 3 or abs(sum(s) - 1) > 1e-3 or min(s, default=0) <= 0)),
    st.tuples(st.sampled_from(["method.name", "dataset.name", "model.name"]),
              st.text(alphabet="abcxyz-_\x00\n\x1b", min_size=1, max_size=12)),
    st.tuples(st.text(alphabet="abcdefghij_", min_size=1, max_size=10).map(lambda k: f"train.{k}_x"),
              st.integers()),
)


def _assert_clean_refusal(result: Any, out: Path) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output and "\x1b" not in result.stderr
    assert not out.exists()


def _set(config: dict[str, Any], dotted: str, value: Any) -> None:
    node = config
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


@FUZZ
@given(bad=bad_value)
def test_random_bad_configs_are_refused_in_one_line(bad: tuple[str, Any]) -> None:
    field, value = bad
    config = yaml.safe_load(yaml.safe_dump(BASE))
    _set(config, field, value)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(yaml.safe_dump(config, allow_unicode=True))
        out = Path(folder) / "out"
        _assert_clean_refusal(runner.invoke(cli.app, ["run", str(path), "--out", str(out), "--no-progress"]), out)


MUTATIONS = ["garbage_npz", "truncated_npz", "missing_split", "both_forms", "nan_feature", "rows_mismatch",
             "negative_label", "graph_unknown_client", "graph_bad_weight", "meta_unknown_key", "csv_garbage",
             "feature_shape", "empty_split", "stray_file"]


def _valid_clients(rng: np.random.Generator, count: int) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    return {f"c{i}": {split: (rng.normal(size=(rows, 3)), rng.integers(0, 3, rows))
                      for split, rows in (("train", 10), ("val", 3), ("test", 3))} for i in range(count)}


def _break(root: Path, mutation: str, rng: np.random.Generator, junk: bytes) -> None:
    client = root / "clients" / f"c{int(rng.integers(0, 3))}"
    split = str(rng.choice(["train", "val", "test"]))
    npz = client / f"{split}.npz"
    if mutation == "garbage_npz":
        npz.write_bytes(b"PK\x03\x04" + junk)
    elif mutation == "truncated_npz":
        npz.write_bytes(npz.read_bytes()[: max(1, len(junk) % 200)])
    elif mutation == "missing_split":
        npz.unlink()
    elif mutation == "both_forms":
        (client / f"{split}.csv").write_text("a,y\n1,0\n")
    elif mutation in ("nan_feature", "rows_mismatch", "negative_label", "feature_shape", "empty_split"):
        with np.load(npz) as data:
            x, y = data["x"].copy(), data["y"].copy()
        if mutation == "nan_feature":
            x[int(rng.integers(0, len(x))), int(rng.integers(0, 3))] = rng.choice([np.nan, np.inf, -np.inf])
        elif mutation == "rows_mismatch":
            y = y[: len(y) - 1]
        elif mutation == "negative_label":
            y[int(rng.integers(0, len(y)))] = -int(rng.integers(1, 10**6))
        elif mutation == "feature_shape":
            x = np.concatenate([x, x[:, :1]], axis=1)
        else:
            x, y = x[:0], y[:0]
        np.savez(npz, x=x, y=y)
    elif mutation == "graph_unknown_client":
        (root / "graph.csv").write_text(f"src,dst\nc0,{junk.hex()[:8]}z\n")
    elif mutation == "graph_bad_weight":
        (root / "graph.csv").write_text(f"src,dst,weight\nc0,c1,{rng.choice(['-1', '0', 'nan', 'inf', '1e40', 'x'])}\n")
    elif mutation == "meta_unknown_key":
        (root / "meta.yaml").write_text(f"{junk.hex()[:6]}_key: 1\n")
    elif mutation == "csv_garbage":
        npz.unlink()
        (client / f"{split}.csv").write_bytes(b"a,b\n" + junk)
    elif mutation == "stray_file":
        (root / "clients" / "notes.txt").write_bytes(junk)


@FUZZ
@given(mutation=st.sampled_from(MUTATIONS), seed=st.integers(0, 2**32 - 1), junk=st.binary(min_size=1, max_size=300))
def test_random_broken_federation_folders_are_refused_in_one_line(mutation: str, seed: int, junk: bytes) -> None:
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as folder:
        root = write_federation(Path(folder) / "fed", _valid_clients(rng, 3))
        _break(root, mutation, rng, junk)
        config = Path(folder) / "config.yaml"
        config.write_text(yaml.safe_dump({**BASE, "dataset": {"name": "folder", "data_dir": str(root)}}))
        out = Path(folder) / "out"
        _assert_clean_refusal(runner.invoke(cli.app, ["run", str(config), "--out", str(out), "--no-progress"]), out)


# ---- command-line values are input too ---------------------------------------------------------------------------

#: keys a user types after --set: real ones, misspelt ones, malformed paths
SET_KEYS = st.one_of(
    st.sampled_from(["train.lr", "train.rounds", "train.metrics", "dataset.split", "dataset.name", "method.name",
                     "method.options.hypernet_hidden", "method.options.server_lr", "model.options.hidden",
                     "train.device", "tracking.backends", "dataset.window", "train.autotune", "seed"]),
    st.text(alphabet="abz._ ü\x00", min_size=0, max_size=12))
#: YAML fragments: unbalanced brackets, tags, anchors, unicode, huge numbers, plain words
SET_VALUES = st.one_of(
    st.sampled_from(["[1,", "{a: ", "]", "!!python/object:os.system", "*anchor", "&a [*a]", "'unclosed", "1e999",
                     "99999999999999999999999", "-1", "true", "null", "[0.7, '0.1', 0.2]", "ü", "\x1b[31m"]),
    st.text(max_size=20))


@FUZZ
@given(key=SET_KEYS, value=SET_VALUES)
def test_any_set_value_is_valid_or_one_line_exit_2_and_nothing_written(key: str, value: str) -> None:
    """`--set KEY=VALUE` with whatever a user might type: the command either accepts it or answers exit 2 with one
    line (no traceback, no Python locals) and writes nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "app"
        result = runner.invoke(cli.app, ["flower-app", "configs/demo_fl60.yaml", "--out", str(out), "--set",
                                         f"{key}={value}"])
        assert result.exit_code in (0, 2), (key, value, result.output)
        if result.exit_code == 2:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output
            assert not out.exists()


def test_the_issues_command_lines_are_one_line_errors(tmp_path: Path) -> None:
    for setting in ("train.lr=[1,", "method.options.hypernet_hidden=true", "dataset.split=['0.7',0.1,0.2]",
                    'method.options.server_lr="0.5"'):
        result = runner.invoke(cli.app, ["run", "configs/demo_fl60.yaml", "--set", setting, "--out",
                                         str(tmp_path / "out"), "--no-progress"])
        assert result.exit_code == 2, (setting, result.output)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in result.output, lines
        assert not (tmp_path / "out").exists()
