"""Simulated faults (``train.dropout``): every method meets rounds with fewer replies than it sent, in the simulator,
before a deployment shows it; the same seed loses the same uploads."""

from __future__ import annotations

import pytest

from conftest import ConfigFactory, single_architecture_methods, without_wall_time
from graphfed.sim.engine import Simulator


@pytest.mark.parametrize("method", single_architecture_methods())
def test_every_method_completes_with_lost_uploads_and_the_same_seed_repeats(make_config: ConfigFactory,
                                                                           method: str) -> None:
    config = make_config(method, "train.dropout=0.3", "train.rounds=6", "train.eval_every=3")
    first = Simulator(config, progress=False).run()
    again = Simulator(config, progress=False).run()
    assert first.status == "completed", first.status
    assert first.dropout == 0.3 and first.lost_uploads > 0  # 6 rounds x 4 clients at 30 %: some were lost
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
