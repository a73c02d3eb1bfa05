"""The simulator's round loop: determinism, resume, failure handling, atomic files and the run directory."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import ConfigFactory, read_rounds, tiny_overrides, without_wall_time
from graphfed import runs
from graphfed.client import executor as executor_module
from graphfed.client.contract import LocalResult
from graphfed.client.executor import check_update
from graphfed.config import RunConfig, load_config
from graphfed.core.params import ParamSpec
from graphfed.data import build_federation
from graphfed.data.federation import ClientSplit, Federation
from graphfed.errors import InvalidUpdateError, NonFiniteUpdateError
from graphfed.models import build_model
from graphfed.sim.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from graphfed.sim.engine import Simulator, run_config

SUMMARY_KEYS = {"method", "dataset", "metric", "test_mean", "test_std", "test_pooled", "novel_mean", "best_round",
                "rounds", "wall_seconds", "bytes_up", "bytes_down"}


def rounds_without_wall_time(out_dir: Path) -> list[dict[str, Any]]:
    return [without_wall_time(record) for record in read_rounds(out_dir)]


def tmp_files(out_dir: Path) -> list[Path]:
    return [path for path in out_dir.rglob("*") if path.name.endswith(".tmp")]


# ---- determinism ---------------------------------------------------------------------------------------


def test_same_config_and_seed_give_identical_results(make_config: ConfigFactory, tmp_path: Path) -> None:
    """Two runs of one config: identical summary (but wall time) and identical rounds.jsonl metric values."""
    cfg = make_config("panacea", "dataset.novel_fraction=0.25")
    first = run_config(cfg, tmp_path / "a", progress=False)
    second = run_config(cfg, tmp_path / "b", progress=False)
    assert first.status == "completed"
    assert without_wall_time(first) == without_wall_time(second)
    assert rounds_without_wall_time(tmp_path / "a") == rounds_without_wall_time(tmp_path / "b")
    assert len(read_rounds(tmp_path / "a")) == 2


def test_different_seed_gives_different_numbers(make_config: ConfigFactory) -> None:
    """Changing only the seed changes the data, the sampling and the training losses."""
    a = run_config(make_config("fedavg", "train.eval_every=1"), progress=False)
    b = run_config(make_config("fedavg", "train.eval_every=1", "seed=1"), progress=False)
    assert a.status == b.status == "completed"
    assert (a.test_mean, a.val_mean, a.test_pooled) != (b.test_mean, b.val_mean, b.test_pooled)


# ---- resume --------------------------------------------------------------------------------------------


def interrupt_at(monkeypatch: pytest.MonkeyPatch, round_index: int) -> None:
    """Make a round raise KeyboardInterrupt when it reaches ``round_index`` (0-based)."""
    original = Simulator.round_steps

    def round_steps(self: Simulator, index: int):  # type: ignore[no-untyped-def]
        if index == round_index:
            raise KeyboardInterrupt
        return (yield from original(self, index))

    monkeypatch.setattr(Simulator, "round_steps", round_steps)


@pytest.mark.parametrize("method", ["panacea", "ditto", "fedrep", "fedala", "fedrod", "pfedme", "per-fedavg", "fedcp",
                                    "fedpac"])
def test_resume_after_interrupt_equals_an_uninterrupted_run(make_config: ConfigFactory, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """Interrupted after a checkpoint and resumed in place: the same summary and rounds.jsonl as a clean run,
    with no round logged twice (records written after the checkpoint are dropped and recomputed). Client-rule
    methods keep per-client state (personal models, heads, ALA weights): it is in the checkpoint too."""
    cfg = make_config(method, "train.rounds=12", "train.eval_every=3", "train.checkpoint_every=5",
                      "dataset.novel_fraction=0.25")
    clean = run_config(cfg, tmp_path / "clean", progress=False)

    out = tmp_path / "resumed"
    interrupt_at(monkeypatch, 8)  # rounds 1..8 done, checkpoint after round 5, rounds.jsonl has rounds 3 and 6
    with pytest.raises(KeyboardInterrupt):
        run_config(cfg, out, progress=False)
    assert [r["round"] for r in read_rounds(out)] == [3, 6]
    assert load_checkpoint(out)["completed_rounds"] == 5
    monkeypatch.undo()

    resumed = run_config(cfg, out, resume=True, progress=False)
    assert without_wall_time(resumed) == without_wall_time(clean)
    rounds = [r["round"] for r in read_rounds(out)]
    assert rounds == [3, 6, 9, 12]
    assert rounds_without_wall_time(out) == rounds_without_wall_time(tmp_path / "clean")


def test_a_checkpoint_written_before_new_config_fields_existed_still_resumes(make_config: ConfigFactory, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint's config text from an older graphfed lacks fields added since (with their defaults): it is
    compared after validation, so the run resumes and ends as an uninterrupted run does."""
    import yaml

    cfg = make_config("fedavg", "train.rounds=6", "train.eval_every=3", "train.checkpoint_every=3")
    clean = run_config(cfg, tmp_path / "clean", progress=False)
    interrupt_at(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        run_config(cfg, tmp_path / "old", progress=False)
    monkeypatch.undo()
    state = load_checkpoint(tmp_path / "old")
    older = yaml.safe_load(state["config"])
    for field in ("novel_clients", "graph", "graph_k"):  # fields this version added to dataset:
        del older["dataset"][field]
    state["config"] = yaml.safe_dump(older, sort_keys=False)
    save_checkpoint(tmp_path / "old", state)
    resumed = run_config(cfg, tmp_path / "old", resume=True, progress=False)
    assert without_wall_time(resumed) == without_wall_time(clean)


def test_resume_with_a_changed_config_is_refused(make_config: ConfigFactory, tmp_path: Path) -> None:
    """A checkpoint written by another config cannot be resumed: CheckpointError says 'different config'."""
    run_config(make_config("fedavg", "train.rounds=5"), tmp_path, progress=False)
    with pytest.raises(CheckpointError, match="different config"):
        run_config(make_config("fedavg", "train.rounds=5", "train.lr=0.01"), tmp_path, resume=True, progress=False)


def test_resuming_a_flower_checkpoint_in_the_simulator_says_exactly_why_not(make_config: ConfigFactory,
                                                                            tmp_path: Path) -> None:
    """A Flower ServerApp checkpoints the server and its run token (its clients' state stays on the nodes; older
    versions wrote ``clients: {}``): `--resume` in the simulator names that and says how to continue on Flower."""
    from graphfed.sim.checkpoint import load_checkpoint, save_checkpoint

    config = make_config("fedavg", "train.rounds=5", "train.checkpoint_every=2")
    run_config(config, tmp_path, progress=False)
    state = load_checkpoint(tmp_path)
    for flower_clients in ({}, {"flower": {"run_token": "0" * 32}}):
        save_checkpoint(tmp_path, {**state, "clients": flower_clients, "completed_rounds": 4})
        with pytest.raises(CheckpointError, match=r"written by a Flower run after round 4; its clients' state is on "
                                                  r"its nodes, so only Flower can continue it: start the same Flower "
                                                  r"App again \(flwr run\), its ServerApp resumes"):
            run_config(config, tmp_path, resume=True, progress=False)
        # a Flower run that finished has nothing to resume: no ServerApp would continue it either
        save_checkpoint(tmp_path, {**state, "clients": flower_clients})
        with pytest.raises(CheckpointError, match=r"a Flower run's that finished all 5 rounds; there is nothing to "
                                                  r"resume"):
            run_config(config, tmp_path, resume=True, progress=False)


def test_a_run_is_the_same_wherever_its_data_lies_but_a_federation_folder_keeps_its_name() -> None:
    """``same_run`` (resume and bench both use it) ignores where the data lies, so a clone under another root keeps
    its runs; a federation folder is the data itself, so another folder name is another run."""
    from graphfed.config import same_run, validate_config

    def config(name: str, data_dir: str | None) -> RunConfig:
        return validate_config({"dataset": {"name": name, "data_dir": data_dir}})

    assert same_run(config("tpt48", "/work/shared/data"), config("tpt48", "/check/work/shared/data"))
    assert same_run(config("tpt48", "/work/shared/data"), config("tpt48", None))
    assert same_run(config("folder", "/a/hospitals"), config("folder", "/b/hospitals"))
    assert not same_run(config("folder", "/a/hospitals"), config("folder", "/a/vehicles"))
    assert not same_run(config("tpt48", None), config("metr-la-week", None))


def test_resume_without_a_checkpoint_is_refused(make_config: ConfigFactory, tmp_path: Path) -> None:
    """Resuming in a directory with no checkpoint names the missing file and says to drop --resume."""
    with pytest.raises(CheckpointError, match=r"no checkpoint at .*checkpoint\.pt.*without --resume"):
        run_config(make_config("fedavg"), tmp_path / "empty", resume=True, progress=False)


def test_resume_from_a_truncated_checkpoint_is_refused(make_config: ConfigFactory, tmp_path: Path) -> None:
    """A truncated checkpoint file gives a CheckpointError naming the file (its checksum no longer matches),
    not a pickle traceback."""
    cfg = make_config("fedavg", "train.rounds=5")
    run_config(cfg, tmp_path, progress=False)
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"checkpoint .*checkpoint\.pt is corrupt"):
        run_config(cfg, tmp_path, resume=True, progress=False)


# ---- failures ------------------------------------------------------------------------------------------


def inject_nan(monkeypatch: pytest.MonkeyPatch, at_call: int, row: int) -> None:
    """Make the engine's ``train_clients`` return NaN weights for ``row`` on its ``at_call``-th call (0-based)."""
    original = executor_module.train_clients
    calls = {"n": 0}

    def train_clients(*args: Any, **kwargs: Any) -> LocalResult:
        result = original(*args, **kwargs)
        trained = result.trained
        if calls["n"] == at_call:
            trained = trained.clone()
            trained[row] = float("nan")
        calls["n"] += 1
        return result._replace(trained=trained)

    monkeypatch.setattr(executor_module, "train_clients", train_clients)


NAN_ROUND_INDEX = 7  # the 8th round; checkpoints after rounds 5 and 10


def test_nan_update_stops_the_run_and_keeps_the_last_checkpoint(make_config: ConfigFactory, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN update stops the run cleanly: status 'stopped: ...' naming the client, summary.json and plot
    written, the checkpoint from before kept and loadable; resuming from it finishes like a clean run."""
    cfg = make_config("fedavg")
    victim = int(Simulator(cfg, progress=False).sample_clients(NAN_ROUND_INDEX)[1])
    inject_nan(monkeypatch, NAN_ROUND_INDEX, row=1)
    summary = run_config(cfg, tmp_path / "run", progress=False)
    assert summary.status.startswith("stopped")
    assert summary.status.endswith(f"update from client(s) {victim}")  # fln's clients are named by their index
    assert "non-finite" in summary.status
    assert runs.read_result(tmp_path / "run") == summary
    assert (tmp_path / "run" / "plots" / "curves.png").stat().st_size > 0
    assert summary.rounds == 5 and [r["round"] for r in read_rounds(tmp_path / "run")] == [5]
    assert load_checkpoint(tmp_path / "run")["completed_rounds"] == 5

    monkeypatch.undo()
    resumed = run_config(cfg, tmp_path / "run", resume=True, progress=False)
    clean = run_config(cfg, tmp_path / "clean", progress=False)
    assert without_wall_time(resumed) == without_wall_time(clean)


def test_nan_stop_names_the_round_as_rounds_jsonl_numbers_it(make_config: ConfigFactory, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds are numbered from 1 everywhere the user looks (rounds.jsonl 'round', best_round, the checkpoint's
    completed_rounds, the progress bar). A NaN in the 8th round must be reported as 'round 8', not 'round 7'."""
    inject_nan(monkeypatch, NAN_ROUND_INDEX, row=0)
    summary = run_config(make_config("fedavg"), tmp_path, progress=False)
    assert summary.status.startswith("stopped")
    assert f"round {NAN_ROUND_INDEX + 1}:" in summary.status, summary.status


def test_check_update_rejects_wrong_shapes() -> None:
    """Wrong client count, wrong width or a 1-D delta -> InvalidUpdateError stating the expected shape."""
    ids = torch.tensor([2, 5, 7])
    check_update(torch.zeros(3, 10), ids, 10, 0)  # the right shape passes
    for bad in (torch.zeros(2, 10), torch.zeros(3, 9), torch.zeros(30), torch.zeros(3, 10, 1)):
        with pytest.raises(InvalidUpdateError, match=r"\(3, 10\) expected"):
            check_update(bad, ids, 10, 4)


def test_all_finite_decides_by_one_sum_and_never_misses_a_bad_value() -> None:
    """A NaN, +Inf, -Inf, or +Inf and -Inf together make the sum non-finite; finite values whose sum overflows
    (3e38 + 3e38) are still all finite: the exact check decides them."""
    from graphfed.client.executor import all_finite

    assert all_finite(torch.zeros(4, 6)) and all_finite(torch.zeros(0, 6)) and all_finite(torch.arange(5))
    for bad in (float("nan"), float("inf"), -float("inf")):
        values = torch.zeros(3, 5)
        values[2, 4] = bad
        assert not all_finite(values), bad
    both = torch.zeros(8)
    both[1], both[6] = float("inf"), -float("inf")
    assert not all_finite(both)
    assert all_finite(torch.tensor([3e38, 3e38, 1.0]))  # its sum overflows; every value is finite
    overflowing = torch.tensor([3e38, 3e38, float("nan")])
    assert not all_finite(overflowing)
    # a client whose update is finite but huge is not rejected
    check_update(torch.full((2, 3), 3e38), torch.tensor([0, 1]), 3, 0)


def test_check_update_names_every_non_finite_client() -> None:
    """NaN and Inf rows raise NonFiniteUpdateError listing exactly those clients, by name when names are known."""
    ids = torch.tensor([2, 5, 7, 9])
    delta = torch.zeros(4, 6)
    delta[1, 3] = float("nan")
    delta[3, 0] = float("inf")
    with pytest.raises(NonFiniteUpdateError, match=r"client\(s\) 5, 9$"):
        check_update(delta, ids, 6, 0)
    names = [f"hospital-{chr(ord('a') + i)}" for i in range(10)]
    with pytest.raises(NonFiniteUpdateError, match=r"client\(s\) hospital-f, hospital-j$"):
        check_update(delta, ids, 6, 0, names)


@pytest.mark.parametrize("reshape", ["one_value_short", "one_client_only"])
def test_engine_rejects_a_wrong_shaped_update(make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch,
                                              reshape: str) -> None:
    """Trained weights of the wrong shape coming back from the clients are rejected by the round loop with
    InvalidUpdateError before the method sees them: neither a raw broadcasting RuntimeError (one value short)
    nor a silent broadcast of one client's row over all sampled clients (one row only)."""
    original = executor_module.train_clients

    def wrong_shape(*args: Any, **kwargs: Any) -> LocalResult:
        result = original(*args, **kwargs)
        return result._replace(trained=result.trained[:, :-1] if reshape == "one_value_short" else result.trained[:1])

    monkeypatch.setattr(executor_module, "train_clients", wrong_shape)
    simulator = Simulator(make_config("fedavg"), progress=False)
    before = simulator.setup.method.state_dict()
    with pytest.raises(InvalidUpdateError, match=r"round .*expected"):
        simulator.run_round(0)
    after = simulator.setup.method.state_dict()
    assert torch.equal(after["global_weights"], before["global_weights"])


# ---- atomic files --------------------------------------------------------------------------------------


def test_no_temporary_files_are_left_in_the_run_directory(make_config: ConfigFactory, tmp_path: Path) -> None:
    """After a run (and a resume) no *.tmp file from the atomic writer remains anywhere in the out dir."""
    cfg = make_config("fedavg", "train.rounds=5")
    run_config(cfg, tmp_path, progress=False)
    (tmp_path / "summary.json").unlink()  # as if it died before its summary: a finished run resumes nothing
    run_config(cfg, tmp_path, resume=True, progress=False)
    assert tmp_files(tmp_path) == []


def test_a_finished_run_leaves_nothing_for_the_garbage_collector(make_config: ConfigFactory, tmp_path: Path) -> None:
    """Once run_config returns, no Simulator (and so no federation) survives in unreachable reference cycles:
    the convergence plot's mathtext parser leaves such cycles through the caller's frames, and a bench running
    cells in one process, where full collections are rare, grew by a CIFAR-10 federation per cell."""
    gc.collect()
    gc.disable()  # as in a long-lived process between full collections
    try:
        run_config(make_config("fedavg", "train.rounds=2"), tmp_path, progress=False)
        survivors = [o for o in gc.get_objects() if isinstance(o, Simulator)]
    finally:
        gc.enable()
    assert (tmp_path / "plots" / "curves.png").is_file()
    assert survivors == []


def test_crash_while_replacing_keeps_the_old_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the rename inside atomic_write_bytes fails, the old checkpoint is intact and the temp file is removed."""
    save_checkpoint(tmp_path, {"completed_rounds": 1, "payload": torch.arange(5)})
    before = (tmp_path / "checkpoint.pt").read_bytes()

    def failing_replace(src: str, dst: str) -> None:
        raise OSError("simulated crash during rename")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(tmp_path, {"completed_rounds": 2, "payload": torch.arange(1000)})
    monkeypatch.undo()
    assert (tmp_path / "checkpoint.pt").read_bytes() == before
    state = load_checkpoint(tmp_path)
    assert state["completed_rounds"] == 1 and torch.equal(state["payload"], torch.arange(5))
    assert tmp_files(tmp_path) == []


def test_crash_during_a_later_checkpoint_leaves_the_earlier_one_resumable(
        make_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that dies while writing its second checkpoint leaves the first one whole; resuming finishes the run
    with the same result as a clean run."""
    cfg = make_config("fedavg")
    real_replace = os.replace
    writes = {"checkpoint": 0}

    def replace(src: str, dst: str) -> None:
        if Path(dst).name == "checkpoint.pt":
            writes["checkpoint"] += 1
            if writes["checkpoint"] == 2:
                raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="disk full"):
        run_config(cfg, tmp_path / "run", progress=False)
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "run")["completed_rounds"] == 5
    assert tmp_files(tmp_path / "run") == []
    resumed = run_config(cfg, tmp_path / "run", resume=True, progress=False)
    clean = run_config(cfg, tmp_path / "clean", progress=False)
    assert without_wall_time(resumed) == without_wall_time(clean)


# ---- the run directory -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunConfig, Path, dict[str, Any]]:
    """One completed tiny FedAvg run evaluated every round, shared by the run-directory tests."""
    cfg = load_config(None, tiny_overrides("fedavg", "train.eval_every=1"))
    out = tmp_path_factory.mktemp("finished")
    return cfg, out, run_config(cfg, out, progress=False)


def test_run_directory_holds_config_log_summary_and_plot(finished_run: tuple[RunConfig, Path, dict[str, Any]]
                                                         ) -> None:
    """config.yaml re-loads into the RunConfig with the thread count it ran at filled in (so it reproduces the
    run elsewhere); rounds.jsonl has one record per evaluation; summary.json has the documented keys;
    plots/curves.png is a non-empty PNG."""
    cfg, out, summary = finished_run
    assert cfg.torch_threads is None
    assert load_config(out / "config.yaml") == cfg.model_copy(update={"torch_threads": torch.get_num_threads()})
    assert summary.torch_threads == torch.get_num_threads()
    assert [r["round"] for r in read_rounds(out)] == list(range(1, cfg.train.rounds + 1))
    saved = json.loads((out / runs.SUMMARY).read_text())  # the file: the result serialised, with its version
    assert set(saved) >= SUMMARY_KEYS and saved["schema_version"] == runs.SCHEMA_VERSION
    assert saved == summary.to_json() and runs.read_result(out) == summary
    assert saved["status"] == "completed"
    assert (saved["method"], saved["dataset"], saved["metric"]) == ("fedavg", "fln", "accuracy")
    assert saved["rounds"] == cfg.train.rounds
    png = (out / "plots" / "curves.png").read_bytes()
    assert len(png) > 1000 and png.startswith(b"\x89PNG\r\n\x1a\n")


def test_bytes_are_counted_per_client_and_parameter(finished_run: tuple[RunConfig, Path, dict[str, Any]]) -> None:
    """bytes_up == bytes_down == rounds * clients_per_round * num_params * 4 (float32 weights each way)."""
    cfg, _, summary = finished_run
    fed = build_federation(cfg.dataset, cfg.seed)
    num_params = ParamSpec.from_module(build_model(cfg.model.name, fed, cfg.model.options)).dim
    assert summary.num_params == num_params
    expected = cfg.train.rounds * cfg.train.clients_per_round * num_params * 4
    assert summary.bytes_up == expected
    assert summary.bytes_down == expected
    assert [r["bytes_up"] for r in read_rounds(finished_run[1])][-1] == expected


def test_best_round_is_the_best_validation_round(finished_run: tuple[RunConfig, Path, dict[str, Any]]) -> None:
    """best_round is the first round with the highest val_mean in rounds.jsonl; the summary's test numbers are
    that round's."""
    _, out, summary = finished_run
    records = read_rounds(out)
    best = max(records, key=lambda r: r["val_mean"])  # max() keeps the first of ties
    assert summary.best_round == best["round"]
    assert summary.test_mean == best["test_mean"]
    assert summary.test_std == best["test_std"]
    assert summary.test_pooled == best["test_pooled"]
    assert summary.final_test_mean == records[-1]["test_mean"]


def _regression_federation(num_clients: int = 6, seed: int = 0) -> Federation:
    """Per-client noisy linear maps R^3 -> R^2: a small regression federation with an MSE metric."""
    g = torch.Generator().manual_seed(seed)
    splits = []
    maps = torch.randn(num_clients, 3, 2, generator=g)
    for rows in (30, 10, 10):
        x = torch.randn(num_clients, rows, 3, generator=g)
        y = x @ maps + 0.3 * torch.randn(num_clients, rows, 2, generator=g)
        splits.append(ClientSplit.from_padded(x, y, torch.full((num_clients,), rows)))
    return Federation(name="toy-regression", task="regression", train=splits[0], val=splits[1], test=splits[2],
                      input_shape=(3,), output_dim=2, metric="mse")


def test_best_round_minimises_mse_for_regression(make_config: ConfigFactory) -> None:
    """With an MSE metric, lower is better: best_round is the round with the smallest val_mean."""
    cfg = make_config("local", "train.eval_every=1", "train.rounds=8", "train.lr=0.02")
    summary = Simulator(cfg, federation=_regression_federation(), progress=False).run()
    assert summary.metric == "mse" and summary.dataset == "toy-regression"
    assert summary.best_round is not None
    # Re-run in memory to get the history (no out dir): evaluate every round and pick the minimum.
    simulator = Simulator(cfg, federation=_regression_federation(), progress=False)
    history = []
    for index in range(cfg.train.rounds):
        simulator.run_round(index)
        history.append(simulator.evaluate(index))
    best = min(history, key=lambda r: r["val_mean"])
    assert summary.best_round == best["round"]
    assert summary.test_mean == pytest.approx(best["test_mean"])
    assert max(r["val_mean"] for r in history) > best["val_mean"]  # the choice was not trivial


def test_novel_mean_is_none_without_novel_clients(finished_run: tuple[RunConfig, Path, dict[str, Any]]) -> None:
    """No novel clients -> novel_mean, novel_adapted_mean are None and num_novel_clients is 0."""
    _, out, summary = finished_run
    assert summary.novel_mean is None and summary.novel_adapted_mean is None
    assert summary.num_novel_clients == 0
    assert all(r["novel_mean"] is None for r in read_rounds(out))


def test_novel_mean_is_a_number_with_novel_clients(make_config: ConfigFactory) -> None:
    """With held-out clients, novel_mean is an accuracy in [0, 1]; a hypernetwork method also reports the
    embedding-adapted figure."""
    summary = run_config(make_config("pfedhn", "dataset.novel_fraction=0.25"), progress=False)
    assert summary.num_novel_clients == 3
    assert isinstance(summary.novel_mean, float) and 0.0 <= summary.novel_mean <= 1.0
    assert isinstance(summary.novel_adapted_mean, float) and 0.0 <= summary.novel_adapted_mean <= 1.0


def test_novel_clients_are_never_trained(make_config: ConfigFactory) -> None:
    """Held-out clients are never sampled for training in any round."""
    simulator = Simulator(make_config("fedavg", "dataset.novel_fraction=0.25", "train.clients_per_round=9"),
                          progress=False)
    novel = set(simulator.setup.federation.novel_client_ids.tolist())
    assert len(novel) == 3
    for index in range(20):
        sampled = set(simulator.sample_clients(index).tolist())
        assert len(sampled) == 9 and not sampled & novel
