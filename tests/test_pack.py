"""Packs: several seeds' runs stepped together, their clients trained and evaluated in shared calls, each run
writing exactly what it writes alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import ConfigFactory, on_kernel_paths
from golden_runs import config_of
from graphfed.config import validate_config
from graphfed.errors import ConfigError
from graphfed.methods import METHODS
from graphfed.runs import RunResult, read_result
from graphfed.sim.engine import Simulator, run_config
from graphfed.sim.pack import Pack, pack_refusal

#: what differs between a run alone and the same run in a pack: how long it took and how it was executed
EXECUTION_FIELDS = {"wall_seconds", "peak_rss_mb", "execution", "code", "device"}
SEEDS = (0, 1, 2)


def fields(result: RunResult) -> dict[str, Any]:
    return {key: value for key, value in result.model_dump(mode="json").items() if key not in EXECUTION_FIELDS}


def seeds_of(make_config: ConfigFactory, method: str, *overrides: str) -> list[Any]:
    return [make_config(method, "train.rounds=4", "train.eval_every=2", f"seed={seed}", *overrides) for seed in SEEDS]


@pytest.mark.parametrize("method", on_kernel_paths(sorted(METHODS), ("fedavg",)))
def test_every_method_in_a_pack_of_three_seeds_gives_each_run_its_own_numbers(method: str,
                                                                               make_config: ConfigFactory) -> None:
    """Every summary field but timings equals the run alone, bit for bit (each client draws from its own run's
    streams). Methods whose clients train different architectures are not packed, and say why."""
    if METHODS[method].architectures in ("ghn", "teacher"):  # they need model.architectures
        configs = [validate_config({**config_of(method), "seed": seed}) for seed in SEEDS]
        assert pack_refusal(configs[0]) == "clients of different architectures train different networks"
        with pytest.raises(ConfigError, match="cannot be packed: clients of different architectures"):
            Pack(configs)
        return
    configs = seeds_of(make_config, method)
    assert pack_refusal(configs[0]) is None
    alone = [run_config(config, progress=False) for config in configs]
    packed = Pack(configs, batched=True).run()
    for single, member in zip(alone, packed, strict=True):
        assert fields(member) == fields(single)
        assert member.execution["pack"]["runs"] == 3 and member.execution["pack"]["batched"] is True


def test_a_pack_shares_its_clients_calls(make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """One training call per round and one evaluation call per evaluation for the whole pack, each with every
    member's clients."""
    from graphfed.client.executor import ClientRuntime

    calls: list[tuple[str, int]] = []
    train, evaluate = ClientRuntime.train, ClientRuntime.evaluate

    def counting_train(self, client_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(("train", len(client_ids)))
        return train(self, client_ids, *args, **kwargs)

    def counting_evaluate(self, client_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(("evaluate", len(client_ids)))
        return evaluate(self, client_ids, *args, **kwargs)

    monkeypatch.setattr(ClientRuntime, "train", counting_train)
    monkeypatch.setattr(ClientRuntime, "evaluate", counting_evaluate)
    configs = seeds_of(make_config, "fedavg", "train.novel_adapt_rounds=0")
    Pack(configs, batched=True).run()
    per_round = 3 * configs[0].train.clients_per_round
    assert [size for kind, size in calls if kind == "train"] == [per_round] * 4
    assert [size for kind, size in calls if kind == "evaluate"] == [3 * 12] * 2


def test_packed_runs_write_their_own_folders_and_resume_alone(make_config: ConfigFactory, tmp_path: Path) -> None:
    """Each member writes its run folder as if alone; a member's checkpoint resumes outside the pack (and a run
    interrupted alone resumes inside one) to the same numbers."""
    configs = seeds_of(make_config, "ditto", "train.rounds=6", "train.checkpoint_every=2")
    dirs = [tmp_path / f"seed{seed}" for seed in SEEDS]
    packed = Pack(configs, dirs, batched=True).run()
    alone = run_config(configs[1], tmp_path / "alone", progress=False)
    assert fields(read_result(dirs[1])) == fields(alone) == fields(packed[1])
    # the pack's checkpoint after round 6 holds member 1's client state as its own runtime would (its summary removed:
    # a finished run resumes nothing, one that died after its last checkpoint resumes)
    (dirs[1] / "summary.json").unlink()
    resumed = Simulator(configs[1].model_copy(update={"train": configs[1].train.model_copy(
        update={"rounds": 6})}), dirs[1], progress=False)
    assert fields(resumed.run(resume=True)) == fields(alone)


def test_a_pack_of_central_dp_runs_draws_each_runs_own_noise_and_sample(make_config: ConfigFactory) -> None:
    """Reproducible central DP in a pack: each member's Poisson sample and noise are its own (its seed's), so the
    numbers equal its run alone; with secure noise the pack completes and accounts every round per member."""
    private = ["privacy.mechanism=central", "privacy.noise_multiplier=1.0"]
    configs = seeds_of(make_config, "fedavg", *private, "privacy.reproducible_noise=true")
    alone = [run_config(config, progress=False) for config in configs]
    assert [fields(member) for member in Pack(configs, batched=True).run()] == [fields(run) for run in alone]
    secure = Pack(seeds_of(make_config, "fedavg", *private), batched=True).run()
    assert all(run.privacy is not None and run.privacy["rounds_released"] == 4 for run in secure)


def test_what_cannot_be_packed_is_refused_in_one_line(make_config: ConfigFactory) -> None:
    attacked = seeds_of(make_config, "fedavg", "attack.kind=sign_flip", "attack.count=2")
    assert pack_refusal(attacked[0]) == "an attack forges each run's own malicious clients' uploads"
    with pytest.raises(ConfigError, match="cannot be packed: an attack forges"):
        Pack(attacked)
    with pytest.raises(ConfigError, match="differ in their seed only"):
        Pack([make_config("fedavg"), make_config("fedavg", "train.lr=0.2")])


def test_a_pack_that_measures_slower_runs_its_members_one_after_another(make_config: ConfigFactory) -> None:
    """Not shared: no runtime over every run's clients, each member built when it starts (one run's data at a time),
    the same numbers, and each summary says how it ran."""
    configs = seeds_of(make_config, "fedavg")
    pack = Pack(configs, batched=False)
    assert pack.runtime is None and len(pack.members) == 1
    results = pack.run()
    assert [fields(run) for run in results] == [fields(run_config(c, progress=False)) for c in configs]
    assert [run.execution["pack"]["batched"] for run in results] == [False] * 3


@pytest.mark.parametrize(("per_run_packed", "batched"), [(0.5, True), (0.95, False)])
def test_the_calibration_packs_only_what_measures_clearly_faster_and_caches_it(
        make_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_run_packed: float,
        batched: bool) -> None:
    """The one call is timed for PACK_CALIBRATION_RUNS runs' clients (not the whole pack's: a compute-bound model's
    calibration must not cost the pack's round) and judged per run against PACK_GAIN; the next pack reads the cache."""
    from graphfed.client import autotune

    setup = Simulator(make_config("fedavg")).setup
    trained: list[int] = []

    def timed(run: Any, device: Any) -> float:  # a stand-in clock: the call's cost from how many clients it trains
        clients = trained[-1]
        return 1.0 if clients == 4 else per_run_packed * clients / 4

    def train(model: Any, spec: Any, start: Any, data: Any, rule: Any, seeds: list[int]) -> None:
        trained.append(len(seeds))

    monkeypatch.setattr(autotune, "train_clients", train)
    monkeypatch.setattr(autotune, "synchronised_seconds", lambda run, device: (run(), timed(run, device))[1])
    cache = tmp_path / "autotune.json"
    choice = autotune.choose_packing(setup.model, setup.spec, setup.federation.train, setup.client_rule, 4, 10, cache)
    assert choice.batched is batched and choice.source == "measured"
    assert max(trained) == 4 * autotune.PACK_CALIBRATION_RUNS  # never the ten runs' forty clients
    again = autotune.choose_packing(setup.model, setup.spec, setup.federation.train, setup.client_rule, 4, 10, cache)
    assert again.batched is batched and again.source == "cached"


def test_one_members_non_finite_update_stops_that_member_only(make_config: ConfigFactory,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 4's shared call meets a NaN from member 0's clients: the pack serves each member alone, member 0
    stops (its status says why) and the others complete with the numbers they have alone."""
    from graphfed.client.executor import ClientRuntime
    from graphfed.errors import NonFiniteUpdateError

    train = ClientRuntime.train

    def breaking(self, client_ids, start, round_index, *args, **kwargs):  # type: ignore[no-untyped-def]
        if round_index == 3 and bool((client_ids < 12).any()):  # member 0 holds the pack's clients 0..11
            raise NonFiniteUpdateError("round 4: non-finite (NaN/Inf) update from client(s) 3")
        return train(self, client_ids, start, round_index, *args, **kwargs)

    configs = seeds_of(make_config, "fedavg", "train.novel_adapt_rounds=0")
    alone = [run_config(config, progress=False) for config in configs[1:]]
    monkeypatch.setattr(ClientRuntime, "train", breaking)
    results = Pack(configs, batched=True).run()
    assert results[0].status == "stopped: round 4: non-finite (NaN/Inf) update from client(s) 3"
    assert [fields(run) for run in results[1:]] == [fields(run) for run in alone]


# ---- where packs are made: compare and bench -----------------------------------------------------------------------
def test_compare_packs_a_rows_seeds_and_its_runs_equal_one_at_a_time(tmp_path: Path) -> None:
    """The issue's acceptance in small: ``compare --seeds`` packs each method's seeds; every run equals
    ``--pack 1``'s, field for field (timings aside)."""
    from typer.testing import CliRunner

    from graphfed import cli

    args = ["compare", "demo", "--methods", "panacea,fedavg", "--seeds", "3", "--set", "train.rounds=4",
            "--set", "train.eval_every=2", "--set", "train.local_steps=5", "--no-progress"]
    packed = CliRunner().invoke(cli.app, [*args, "--out", str(tmp_path / "packed")])
    assert packed.exit_code == 0, packed.output
    assert "seeds 0, 1, 2 ran as one pack" in " ".join(packed.stdout.split())
    single = CliRunner().invoke(cli.app, [*args, "--out", str(tmp_path / "single"), "--pack", "1"])
    assert single.exit_code == 0, single.output
    for method in ("panacea", "fedavg"):
        for seed in SEEDS:
            made = read_result(tmp_path / "packed" / method / f"seed{seed}")
            assert made.execution["pack"]["runs"] == 3
            assert fields(made) == fields(read_result(tmp_path / "single" / method / f"seed{seed}"))


@pytest.mark.parametrize("in_process", [True, False], ids=["in-process", "subprocess"])
def test_bench_runs_a_cells_seeds_as_one_pack(tmp_path: Path, in_process: bool) -> None:
    from graphfed.bench import run_suite
    from test_bench import _tiny_fln_suite

    suite = _tiny_fln_suite(tmp_path, "packs", 3, ["fedavg"])
    lines: list[str] = []
    run_suite(suite, tmp_path / "packed", in_process=in_process, echo=lines.append)
    run_suite(suite, tmp_path / "single", in_process=True, echo=lambda line: None, pack=1)
    for seed in SEEDS:
        packed = read_result(tmp_path / "packed" / "runs" / "fln" / "fedavg" / f"seed{seed}")
        assert packed.execution["pack"]["runs"] == 3
        assert fields(packed) == fields(read_result(tmp_path / "single" / "runs" / "fln" / "fedavg" / f"seed{seed}"))
    assert sum("fln fedavg seed" in line and "completed" in line for line in lines) == 3
