"""The vouch suite: tiny seeded runs that exercise the engine (every method's golden config, then the engine's
features on FL-N: privacy in reproducible mode, attacks, a defence, faults, late clients, early stopping, chosen
metrics, inferred graphs, a server optimiser, robust aggregation; then the methods the suites run on regression data,
on TPT-48 and METR-LA, and the convolutional models no golden run trains), each summary written out whole but for how
the run was executed. ``tools/vouch.py`` runs it against two revisions and compares.

    python tools/vouch_suite.py --out summaries.json [--no-privacy]

It must run under older revisions too: it imports only what every revision since the golden runs has.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
# the golden configs read the real datasets beside the project, as the tests do
os.environ.setdefault("GRAPHFED_DATA", str((ROOT / ".." / "shared" / "data").resolve()))

#: what differs between two runs of one config on one machine, or records how (not what) a run computed; and the
#: sentences written from fields compared here (``flags``, from ``per_client``): a new sentence is no new behaviour
EXECUTION = {"wall_seconds", "peak_rss_mb", "code", "execution", "device", "cell_seconds", "flags"}
FLN = ["dataset.name=fln", "dataset.num_clients=12", "dataset.novel_fraction=0.25", "model.options={hidden: 8}",
       "train.rounds=8", "train.local_steps=5", "train.batch_size=16", "train.clients_per_round=4",
       "train.eval_every=2", "train.novel_adapt_rounds=2", "torch_threads=1", "train.autotune=false"]
PANACEA = "method.options={embedding_dim: 8, gnn_hidden: 16, hypernet_hidden: 16, server_steps: 2}"
FEATURES = {
    "attack-poisoning": ["method.name=fedavg", "attack.kind=model_poisoning", "attack.fraction=0.25"],
    "attack-label-flip": ["method.name=ditto", "attack.kind=label_flip", "attack.fraction=0.25"],
    "backdoor-tuning": ["method.name=fedavg", "attack.kind=backdoor", "attack.count=1", "defense.simple_tuning=true"],
    "dropout": ["method.name=fedavg", "train.dropout=0.3"],
    "stragglers": ["method.name=fedavg", "train.stragglers=0.25", "train.straggler_delay=1"],
    "late-clients": ["method.name=pfedgat", "train.late_clients=2", "train.join_round=5",
                     "method.options={feedback: loss_only}"],
    "early-stop": ["method.name=fedavg", "train.patience=1", "train.rounds=20"],
    "metrics": ["method.name=fedavg", "train.metrics=[auroc, macro_f1]"],
    "select-by": ["method.name=fedavg", "train.metrics=[macro_f1]", "train.select_by=macro_f1"],
    "panacea-knn": ["method.name=panacea", "dataset.graph=knn", PANACEA],
    "panacea-inferred": ["method.name=panacea", "dataset.graph=none", PANACEA],
    "fedopt": ["method.name=fedavg", "method.options={server_optimizer: adam, server_lr: 0.01}"],
    "krum": ["method.name=fedavg", "method.options={aggregation: krum, num_malicious_nodes: 1}"],
}
#: the methods the suites run on regression data, on TPT-48 (their regression paths: a golden run is classification)
TPT48 = ["dataset.name=tpt48", "dataset.novel_fraction=0.2", "model.name=mlp", "model.options={hidden: 8}",
         "train.rounds=4", "train.local_steps=3", "train.batch_size=16", "train.clients_per_round=4",
         "train.eval_every=2", "train.novel_adapt_rounds=2", "torch_threads=1", "train.autotune=false"]
REGRESSION = {
    **{f"tpt48:{method}": [*TPT48, f"method.name={method}"]
       for method in ("fedavg", "fedavg-ft", "ditto", "local", "per-fedavg", "pfedme", "sfl", "pfedhn")},
    **{f"tpt48:{method}": [*TPT48, f"method.name={method}", PANACEA]
       for method in ("panacea", "panacea-gn", "panacea-mlp")},
    "metr-la:gru": ["dataset.name=metr-la-week", "model.name=gru", "model.options={hidden: 8}", "method.name=fedavg",
                    "train.rounds=2", "train.local_steps=2", "train.batch_size=16", "train.clients_per_round=4",
                    "train.eval_every=2", "torch_threads=1", "train.autotune=false"],
}
#: the convolutional models no golden run trains (a golden run's images go through CNN-BN), on a few MNIST clients
IMAGES = ["dataset.name=mnist", "dataset.num_clients=4", "dataset.client_fraction=0.01", "method.name=fedavg",
          "train.rounds=2", "train.local_steps=2", "train.batch_size=16", "train.clients_per_round=3",
          "train.eval_every=2", "torch_threads=1", "train.autotune=false"]
CONVOLUTIONS = {f"mnist:{model}": [*IMAGES, f"model.name={model}", "model.options={}"]
                for model in ("lenet", "cnn", "pfl-cnn")}
PRIVATE = {
    "central": ["method.name=fedavg", "privacy.mechanism=central", "privacy.noise_multiplier=1.0"],
    "local": ["method.name=ditto", "privacy.mechanism=local", "privacy.noise_multiplier=1.0"],
    "central-hypernetwork": ["method.name=pfedhn", "privacy.mechanism=central", "privacy.noise_multiplier=1.0",
                             "method.options={hidden: 16, embedding_dim: 4}"],
    "adaptive-clip": ["method.name=fedavg", "privacy.mechanism=central", "privacy.noise_multiplier=1.0",
                      "privacy.adaptive_quantile=0.5"],
}


#: the sentences of a private run's ``privacy`` record (what the noise check says, what lies outside the guarantee,
#: what the noise was sized for): written from the numbers compared beside them, like ``flags``
PRIVACY_SENTENCES = {"noise_check", "outside_the_guarantee", "calibrated_for", "sized_for", "noise",
                     "neighbours_meaning", "delta_source", "sampling"}


def summary(result: object) -> dict[str, object]:
    data = result.model_dump(mode="json") if hasattr(result, "model_dump") else dict(result)  # type: ignore[attr-defined]
    kept = {key: value for key, value in data.items() if key not in EXECUTION}
    if isinstance(kept.get("privacy"), dict):
        kept["privacy"] = {key: value for key, value in kept["privacy"].items() if key not in PRIVACY_SENTENCES}
    return kept


def suite_configs(no_privacy: bool) -> dict[str, object]:
    """Every run of the suite by name: each method's golden config, then the engine's features on FL-N."""
    from golden_runs import config_of, methods
    from graphfed.config import load_config, validate_config

    configs: dict[str, object] = {f"golden:{method}": validate_config(config_of(method)) for method in methods()}
    private = {} if no_privacy else {name: [*overrides, "privacy.reproducible_noise=true"]
                                     for name, overrides in PRIVATE.items()}
    configs.update({name: load_config(None, FLN + overrides) for name, overrides in {**FEATURES, **private}.items()})
    configs.update({name: load_config(None, overrides) for name, overrides in {**REGRESSION, **CONVOLUTIONS}.items()})
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-privacy", action="store_true", help="leave out the private runs")
    args = parser.parse_args()
    from graphfed.sim.engine import run_config

    out: dict[str, object] = {}
    for name, config in suite_configs(args.no_privacy).items():
        out[name] = summary(run_config(config, None, progress=False))
        print(name, flush=True)
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
