"""The simulated clock and asynchronous rounds: FedBuff's buffered, staleness-weighted server step, FedAsync's
mixing, what refuses, and a resumed asynchronous run that equals an uninterrupted one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from conftest import ConfigFactory, read_rounds, without_wall_time
from graphfed.config import ClockConfig, ConfigError
from graphfed.sim.asynchronous import Dispatch, staleness_weights
from graphfed.sim.checkpoint import load_checkpoint
from graphfed.sim.clock import SimulatedClock
from graphfed.sim.engine import Simulator, run_config

SPREAD = "train.clock={speed_spread: 10.0}"


# ---- the clock ----------------------------------------------------------------------------------------------------
def test_client_speeds_spread_as_configured_and_an_offline_client_pauses() -> None:
    speeds = SimulatedClock(ClockConfig(speed_spread=10.0), 20_000, 5, seed=0).speeds
    ratio = float(torch.quantile(speeds, 0.95) / torch.quantile(speeds, 0.05))
    assert 9.0 < ratio < 11.0
    clock = SimulatedClock(ClockConfig(availability=0.5, period_seconds=100.0, step_seconds=10.0), 3, 8, seed=0)
    client = 1
    clock.phases[client] = 0.0  # online in [0, 50), offline in [50, 100), ...
    clock.speeds[client] = 1.0  # 80 s of work
    assert clock.online(client, 10.0) and not clock.online(client, 60.0)
    assert clock.finish(client, 0.0) == pytest.approx(130.0)  # 50 s, a 50 s pause, then the last 30 s
    assert clock.finish(client, 60.0) == pytest.approx(230.0)  # waits for 100, then as from 0


def test_a_dispatch_gets_exactly_its_work_in_online_time_from_any_start() -> None:
    """Over many starts (window edges included, where a time summed window by window once stalled below a float's
    resolution and hung a run), the online time between start and finish is the dispatch's work."""
    clock = SimulatedClock(ClockConfig(availability=0.37, period_seconds=61.3, speed_spread=10.0), 50, 7, seed=4)
    period, on = 61.3, 0.37 * 61.3
    generator = torch.Generator().manual_seed(0)
    for client, start in zip(torch.randint(50, (400,), generator=generator).tolist(),
                             (torch.rand(400, generator=generator, dtype=torch.float64) * 5e4).tolist(), strict=True):
        phase = float(clock.phases[client])
        edge = (math.floor((start + phase) / period) * period - phase) + on  # a window's closing edge
        for begin in (start, edge, math.nextafter(edge, 0.0)):
            end = clock.finish(client, begin)
            cycles = range(math.floor((begin + phase) / period), math.floor((end + phase) / period) + 1)
            online = sum(max(0.0, min(end, k * period - phase + on) - max(begin, k * period - phase)) for k in cycles)
            assert online == pytest.approx(clock.work_seconds(client), rel=1e-9, abs=1e-6)


def rounds_without_wall_time(out_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    return [without_wall_time(record) for record in read_rounds(out_dir)]


def test_a_synchronous_round_lasts_until_its_slowest_client_and_the_numbers_stay_as_without_a_clock(
        make_config: ConfigFactory, tmp_path: Path) -> None:
    plain = make_config("fedavg", "train.eval_every=1", "train.rounds=3")
    timed = make_config("fedavg", "train.eval_every=1", "train.rounds=3",
                        "train.clock={speed_spread: 10.0, server_seconds: 2.0}")
    simulator = Simulator(timed, progress=False)
    cohort = simulator.sample_clients(0)
    expected_first = max(simulator.sim_clock.work_seconds(int(c)) for c in cohort) + 2.0
    first = run_config(plain, tmp_path / "plain", progress=False)
    simulator.out_dir = tmp_path / "timed"
    second = simulator.run()
    untimed = [{**without_wall_time(result), "sim_seconds": None} for result in (first, second)]
    assert untimed[0] == untimed[1]  # the clock measures only
    assert ([{**record, "sim_seconds": None} for record in rounds_without_wall_time(tmp_path / "plain")]
            == [{**record, "sim_seconds": None} for record in rounds_without_wall_time(tmp_path / "timed")])
    times = [record["sim_seconds"] for record in read_rounds(tmp_path / "timed")]
    assert times[0] == pytest.approx(expected_first) and times[0] < times[1] < times[2]
    assert second.sim_seconds == times[2]


# ---- FedBuff ------------------------------------------------------------------------------------------------------
def test_staleness_weights_follow_fedbuffs_inverse_square_root() -> None:
    tau = torch.tensor([0, 1, 3, 8])
    torch.testing.assert_close(staleness_weights(tau, "polynomial", 0.5), torch.tensor([1.0, 2 ** -0.5, 0.5, 1 / 3]))
    assert staleness_weights(tau, "constant", 0.5).tolist() == [1.0] * 4


def buffered(simulator: Simulator, clients: list[int], versions: list[int], seed: int = 0) -> list[Dispatch]:
    """Updates in the buffer sent at ``versions``, from weights that differ from today's global model."""
    generator = torch.Generator().manual_seed(seed)
    dim = simulator.setup.spec.dim
    return [Dispatch(client, version, 0.0, torch.randn(dim, generator=generator),
                     torch.randn(dim, generator=generator),
                     {"loss_first": torch.ones(1), "loss_last": torch.ones(1),
                      "num_examples": torch.tensor([10.0 * (i + 1)])})
            for i, (client, version) in enumerate(zip(clients, versions, strict=True))]


def test_a_buffer_step_moves_the_global_model_by_each_deltas_staleness_weighted_mean(
        make_config: ConfigFactory) -> None:
    """x <- x - sum_k n_k s(version - sent_k) delta_k / sum_k n_k, where delta_k = sent_k - trained_k is the change
    from the weights the client was sent, not from today's model."""
    simulator = Simulator(make_config("fedavg", "train.server_mode=fedbuff", "train.buffer_size=3", SPREAD),
                          progress=False)
    server, method = simulator.async_server, simulator.setup.method
    assert server is not None
    server.version = 5
    server.buffer = buffered(simulator, [7, 2, 4], [5, 1, 4])
    before = method.global_weights.clone()
    stats = server.server_step(simulator)
    by_client = sorted(buffered(simulator, [7, 2, 4], [5, 1, 4]), key=lambda d: d.client)
    weights = torch.tensor([20.0, 30.0, 10.0]) * torch.tensor([5.0 ** -0.5, 2.0 ** -0.5, 1.0])  # clients 2, 4, 7
    expected = before - (weights[:, None] * torch.stack([d.delta for d in by_client])).sum(0) / 60.0
    torch.testing.assert_close(method.global_weights, expected)
    assert stats["clients"] == 3 and stats["staleness_max"] == 4 and server.version == 6 and not server.buffer


def test_the_server_steps_only_when_the_buffer_holds_k_updates_and_keeps_concurrency_clients_busy(
        make_config: ConfigFactory, tmp_path: Path) -> None:
    config = make_config("fedavg", "train.server_mode=fedbuff", "train.buffer_size=3", "train.concurrency=5",
                         "train.rounds=6", "train.eval_every=2", SPREAD)
    simulator = Simulator(config, tmp_path, progress=False)
    steps: list[int] = []
    original = simulator.async_server.server_step  # type: ignore[union-attr]

    def counted(sim: Simulator) -> dict[str, float | None]:
        steps.append(len(sim.async_server.buffer))  # type: ignore[union-attr]
        return original(sim)

    simulator.async_server.server_step = counted  # type: ignore[union-attr,method-assign]
    result = simulator.run()
    assert steps == [3] * 6
    assert len(simulator.async_server.in_flight) == 5  # type: ignore[union-attr]
    assert result.test_mean is not None and result.test_mean > 0.5
    times = [record["sim_seconds"] for record in read_rounds(tmp_path)]
    assert len(times) == 3 and times == sorted(times) and times[0] > 0
    assert result.asynchronous is not None and result.asynchronous["server_steps"] == 6


def test_fedasync_mixes_the_global_model_with_the_arriving_clients_model(make_config: ConfigFactory) -> None:
    simulator = Simulator(make_config("fedavg", "train.server_mode=fedasync", "train.mixing=0.5", SPREAD),
                          progress=False)
    server, method = simulator.async_server, simulator.setup.method
    assert server is not None and server.buffer_size == 1
    server.version = 3
    server.buffer = buffered(simulator, [4], [0])
    arriving = server.buffer[0]
    before = method.global_weights.clone()
    server.server_step(simulator)
    alpha = 0.5 * (1 + 3) ** -0.5
    torch.testing.assert_close(method.global_weights,
                               (1 - alpha) * before + alpha * (arriving.sent - arriving.delta))


# ---- who refuses --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "mode", "words"), [
    ("fedaghn", "fedbuff", "fedaghn does not run asynchronously: its attentive graph hypernetwork"),
    ("pfedgat", "fedbuff", "pfedgat does not run asynchronously: its server GAT"),
    ("panacea", "fedasync", "panacea has no one global model; use train.server_mode=fedbuff"),
])
def test_a_method_that_cannot_run_asynchronously_refuses_in_one_line(make_config: ConfigFactory, method: str,
                                                                     mode: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as refused:
        Simulator(make_config(method, f"train.server_mode={mode}"), progress=False)
    assert "\n" not in str(refused.value)


def test_asynchronous_rounds_refuse_dp_and_the_per_round_faults(make_config: ConfigFactory) -> None:
    with pytest.raises(ConfigError, match="Poisson sample"):
        Simulator(make_config("fedavg", "train.server_mode=fedbuff", "privacy.mechanism=local",
                              "privacy.noise_multiplier=1.0"), progress=False)
    with pytest.raises(ConfigError, match=r"train\.stragglers: asynchronous rounds model slow"):
        make_config("fedavg", "train.server_mode=fedbuff", "train.stragglers=0.2")
    with pytest.raises(ConfigError, match=r"train\.buffer_size: only asynchronous rounds use it"):
        make_config("fedavg", "train.buffer_size=3")


# ---- resume and time budgets --------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["fedavg", "panacea"])
def test_a_resumed_asynchronous_run_equals_an_uninterrupted_one_clock_included(
        make_config: ConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    config = make_config(method, "train.server_mode=fedbuff", "train.rounds=9", "train.eval_every=3",
                         "train.checkpoint_every=4", "dataset.novel_fraction=0.0",
                         "train.clock={speed_spread: 10.0, availability: 0.6, period_seconds: 20.0}")
    clean = run_config(config, tmp_path / "clean", progress=False)
    original = Simulator.round_steps

    def interrupted(self: Simulator, index: int):  # type: ignore[no-untyped-def]
        if index == 6:
            raise KeyboardInterrupt
        return (yield from original(self, index))

    monkeypatch.setattr(Simulator, "round_steps", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_config(config, tmp_path / "resumed", progress=False)
    state = load_checkpoint(tmp_path / "resumed")
    assert state["completed_rounds"] == 4 and state["tracker"]["sim_seconds"] > 0
    assert state["asynchronous"]["in_flight"]  # the work in flight is in the checkpoint
    monkeypatch.undo()
    resumed = run_config(config, tmp_path / "resumed", resume=True, progress=False)
    assert without_wall_time(resumed) == without_wall_time(clean)
    assert ([without_wall_time(r) for r in read_rounds(tmp_path / "resumed")]
            == [without_wall_time(r) for r in read_rounds(tmp_path / "clean")])


def test_a_time_budget_stops_the_run_at_the_round_that_reaches_it(make_config: ConfigFactory,
                                                                   tmp_path: Path) -> None:
    run_config(make_config("fedavg", "train.rounds=10", "train.eval_every=1", SPREAD), tmp_path / "all",
               progress=False)
    times = [record["sim_seconds"] for record in read_rounds(tmp_path / "all")]
    budget = (times[3] + times[4]) / 2  # inside round 5
    limited = run_config(make_config("fedavg", "train.rounds=10", "train.eval_every=3", SPREAD,
                                     f"train.time_budget={budget}"), tmp_path / "limited", progress=False)
    assert limited.rounds == 5 and [r["round"] for r in read_rounds(tmp_path / "limited")] == [3, 5]
    assert limited.stopped_at_time is not None and math.isclose(limited.stopped_at_time["sim_seconds"], times[4])


# ---- what a user reads ------------------------------------------------------------------------------------------
def test_show_and_compare_tell_the_clocks_story(make_config: ConfigFactory, tmp_path: Path) -> None:
    """``graphfed show`` names the asynchronous server, the budget and the time to the target; ``compare --x time``
    prints each row's time to the target (the same first reach its runs' summaries record)."""
    from typer.testing import CliRunner

    from graphfed import cli
    from graphfed.config import dump_config

    config = make_config("fedavg", "train.server_mode=fedbuff", "train.buffer_size=3", "train.rounds=40",
                         "train.eval_every=2", SPREAD, "train.target_score=0.5", "train.time_budget=60")
    runner = CliRunner()
    run_config(config, tmp_path / "run", progress=False)
    shown = runner.invoke(cli.app, ["show", str(tmp_path / "run")])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())  # the console wraps lines
    assert "asynchronous: fedbuff, 6 clients training at once, a server step every 3 update(s)" in text, text[:600]
    assert "of its 60 s budget" in text and "test mean reached 50 % at round" in text, text[:600]
    path = tmp_path / "tiny.yaml"
    path.write_text(dump_config(make_config("fedavg", "train.rounds=40", "train.eval_every=2", SPREAD,
                                            "train.target_score=0.5", "train.time_budget=60")))
    compared = runner.invoke(cli.app, ["compare", str(path), "--variant", "sync:train.server_mode=sync",
                                       "--variant", "buffered:train.server_mode=fedbuff,train.buffer_size=3",
                                       "--x", "time",
                                       "--out", str(tmp_path / "compare"), "--no-progress"])
    assert compared.exit_code == 0, compared.output
    line = next(text for text in compared.output.splitlines() if "until the test mean first reached 50 %" in text)
    seconds = load_result_seconds(tmp_path / "compare" / "buffered" / "seed0")
    assert f"buffered {seconds:.0f} ± 0 s" in " ".join(compared.output.split()) or "buffered never" in line
    assert (tmp_path / "compare" / "compare.png").stat().st_size > 0


def load_result_seconds(run_dir: Path) -> float:
    from graphfed.runs import read_result

    reached = read_result(run_dir).time_to_target
    assert reached is not None and reached["sim_seconds"] is not None
    return float(reached["sim_seconds"])
