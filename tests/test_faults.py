"""Simulated faults (``train.dropout``, ``train.stragglers``): every method meets rounds with fewer replies than it
sent, and uploads that arrive rounds late, in the simulator, before a deployment shows it; the same seed loses and
delays the same uploads, and a resumed run delivers what was in flight."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import ConfigFactory, single_architecture_methods, without_wall_time
from graphfed.sim.checkpoint import load_checkpoint
from graphfed.sim.engine import Simulator
from test_engine import interrupt_at


@pytest.mark.parametrize("method", single_architecture_methods())
def test_every_method_completes_with_lost_uploads_and_the_same_seed_repeats(make_config: ConfigFactory,
                                                                           method: str) -> None:
    config = make_config(method, "train.dropout=0.3", "train.stragglers=0.3", "train.rounds=6", "train.eval_every=3")
    first = Simulator(config, progress=False).run()
    again = Simulator(config, progress=False).run()
    assert first.status == "completed", first.status
    assert first.dropout == 0.3 and first.lost_uploads > 0  # 6 rounds x 4 clients at 30 %: some were lost
    assert first.stragglers and first.late_uploads > 0
    assert without_wall_time(first) == without_wall_time(again)


def test_dropout_loses_about_its_share_and_the_server_sees_only_what_arrived(make_config: ConfigFactory) -> None:
    from graphfed.methods.fedavg import FedAvg

    seen: list[int] = []
    update = FedAvg.update

    def counting(self: FedAvg, client_ids, sent, delta, metrics) -> None:  # type: ignore[no-untyped-def]
        seen.append(len(client_ids))
        update(self, client_ids, sent, delta, metrics)

    config = make_config("fedavg", "train.dropout=0.5", "train.rounds=60", "train.eval_every=60")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FedAvg, "update", counting)
        result = Simulator(config, progress=False).run()
    sent = 60 * config.train.clients_per_round
    assert result.lost_uploads == sent - sum(seen)  # every lost upload counted, none reached the server
    assert 0.35 < result.lost_uploads / sent < 0.65  # a seeded coin per upload


def _recording_updates(patch: pytest.MonkeyPatch) -> list[tuple[list[int], torch.Tensor]]:
    """Patch FedAvg.update to record, per call, the client ids and the weights they were sent."""
    from graphfed.methods.fedavg import FedAvg

    calls: list[tuple[list[int], torch.Tensor]] = []
    update = FedAvg.update

    def recording(self: FedAvg, client_ids, sent, delta, metrics) -> None:  # type: ignore[no-untyped-def]
        calls.append((client_ids.tolist(), sent.clone()))
        update(self, client_ids, sent, delta, metrics)

    patch.setattr(FedAvg, "update", recording)
    return calls


def test_a_stragglers_upload_reaches_the_server_a_round_late_with_the_weights_it_was_sent(
        make_config: ConfigFactory) -> None:
    config = make_config("fedavg", "train.stragglers=0.25", "train.rounds=4", "train.eval_every=4",
                         "train.clients_per_round=100", "dataset.novel_fraction=0")
    with pytest.MonkeyPatch.context() as patch:
        calls = _recording_updates(patch)
        result = Simulator(config, progress=False).run()
    names = result.per_client or {}
    stragglers = sorted(list(names).index(name) for name in result.stragglers or [])
    everyone = list(range(len(names)))
    assert len(stragglers) == round(0.25 * len(everyone))
    assert calls[0][0] == [c for c in everyone if c not in stragglers]  # round 1: theirs are still on the way
    for (ids, sent), (_, previous_sent) in zip(calls[1:], calls[:-1], strict=True):
        assert ids == everyone  # the fresh uploads and last round's late ones
        for position, client in enumerate(ids):
            if client in stragglers:  # FedAvg sends everyone one model: last round's, for a late upload
                assert torch.equal(sent[position], previous_sent[0])
            else:
                assert torch.equal(sent[position], sent[ids.index(next(c for c in ids if c not in stragglers))])
    assert result.late_uploads == 3 * len(stragglers) and result.lost_uploads == 0


@pytest.mark.parametrize("why", ["delay 0", "method cannot"])
def test_a_late_upload_is_lost_at_delay_zero_or_when_the_method_cannot_use_it(make_config: ConfigFactory,
                                                                             why: str) -> None:
    from graphfed.methods.fedavg import FedAvg

    delay = "train.straggler_delay=0" if why == "delay 0" else "train.straggler_delay=1"
    config = make_config("fedavg", "train.stragglers=0.5", delay, "train.rounds=3", "train.eval_every=3",
                         "train.clients_per_round=100", "dataset.novel_fraction=0")
    with pytest.MonkeyPatch.context() as patch:
        if why == "method cannot":
            patch.setattr(FedAvg, "accepts_late_uploads", False)
        calls = _recording_updates(patch)
        result = Simulator(config, progress=False).run()
    stragglers = len(result.stragglers or [])
    assert result.late_uploads == 0 and result.lost_uploads == 3 * stragglers
    assert all(len(ids) == result.training_clients - stragglers for ids, _ in calls)


def test_a_resumed_run_delivers_the_uploads_that_were_in_flight(make_config: ConfigFactory, tmp_path: Path) -> None:
    """Interrupted after round 2 with stragglers' round-2 uploads still on their way, the resumed run delivers them
    in round 3, as the uninterrupted run does."""
    config = make_config("fedavg", "train.stragglers=0.3", "train.straggler_delay=1", "train.rounds=4",
                         "train.eval_every=1", "train.checkpoint_every=1")
    whole = Simulator(config, progress=False).run()
    with pytest.MonkeyPatch.context() as patch:
        interrupt_at(patch, 2)
        with pytest.raises(KeyboardInterrupt):
            Simulator(config, tmp_path, progress=False).run()
    assert load_checkpoint(tmp_path)["in_flight"]  # the checkpoint really holds uploads on their way
    resumed = Simulator(config, tmp_path, progress=False).run(resume=True)
    assert without_wall_time(resumed) == without_wall_time(whole)
