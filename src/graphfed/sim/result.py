"""A finished (or stopped) run's :class:`~graphfed.runs.RunResult`: the selected round's scores, every client's
beside its trivial predictor, what the reader must know (flags), the privacy spent, and how the run was made."""

from __future__ import annotations

import resource
import sys
from typing import TYPE_CHECKING, Any

import torch

from graphfed import runs
from graphfed.client.metrics import HIGHER_IS_BETTER
from graphfed.provenance import run_code
from graphfed.runs import RunResult
from graphfed.setup import run_roots
from graphfed.sim.observe import finite, mean_std

if TYPE_CHECKING:
    from graphfed.sim.engine import Simulator

#: what an evaluation records under attack (when there are attackers / a backdoor), carried into summary.json
ROBUSTNESS_FIELDS = ("honest_test_mean", "honest_test_std", "malicious_test_mean", "asr_mean", "asr_honest",
                     "asr_malicious")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (what a run needed, counting the data it loaded)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)  # bytes on macOS, KiB on Linux


def isolated_novel_clients(sim: Simulator) -> set[int]:
    """Novel clients the method's client graph links to no training client (their model is a guess from nothing
    the federation learned about them: Panacea's inferred graph never links a client that never uploaded)."""
    fed = sim.setup.federation
    if not len(fed.novel_client_ids):
        return set()
    graph = sim.setup.method.collaboration_graph()
    if graph is None or graph.ndim != 2:
        return set()
    links = graph[fed.novel_client_ids][:, fed.train_client_ids].abs().sum(1).cpu()
    return {int(client) for client, total in zip(fed.novel_client_ids, links, strict=True) if float(total) == 0}


def flags(metric: str, per_client: dict[str, dict[str, Any]]) -> list[str]:
    """One sentence per thing a reader of this run's numbers must know (logged at the end of the run)."""
    higher = HIGHER_IS_BETTER[metric]
    novel = {name: scores for name, scores in per_client.items() if scores.get("novel")}
    trained = {name: scores for name, scores in per_client.items() if not scores.get("novel")}
    isolated = [name for name, scores in novel.items() if scores.get("no_graph_neighbours")]

    def below_trivial(clients: dict[str, dict[str, Any]]) -> list[str]:
        return [f"{name} ({scores['test']:.4g} against {scores['trivial_test']:.4g})"
                for name, scores in clients.items()
                if scores.get("test") is not None and scores.get("trivial_test") is not None
                and (scores["test"] < scores["trivial_test"] if higher else scores["test"] > scores["trivial_test"])]

    below, trained_below = below_trivial(novel), below_trivial(trained)

    def listed(names: list[str]) -> str:
        return ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")

    found = []
    if isolated:
        found.append(f"novel client(s) with no neighbour among the training clients in the method's client graph: "
                     f"{listed(isolated)}; their model is the method's guess for clients it knows nothing of (give "
                     f"the dataset's graph, or check dataset.graph)")
    predictor = f"({metric} against predicting their training {'majority class' if higher else 'mean'})"
    if trained_below:
        found.append(f"trained client(s) scoring below their trivial predictor {predictor}: {len(trained_below)} of "
                     f"{len(trained)}, {listed(trained_below)}; the model learned less than that guess (check the "
                     f"features' scales: graphfed inspect flags them, dataset.standardize: client fixes them)")
    if below:
        found.append(f"novel client(s) scoring below their trivial predictor {predictor}: {listed(below)}")
    return found


def per_client(sim: Simulator, best: dict[str, Any]) -> dict[str, Any]:
    """Each client's scores at the selected round beside its trivial predictor's, its role, and the early stop."""
    fed, attack = sim.setup.federation, sim.setup.clients.attack
    scored = best.get("per_client", {})
    isolated = isolated_novel_clients(sim)
    clients = {name: {**scored.get(name, {"val": None, "test": None}),
                      "trivial_test": finite(sim.trivial[i]), "novel": bool(fed.novel_mask[i]),
                      **({"no_graph_neighbours": True} if i in isolated else {}),
                      **({"malicious": bool(attack.malicious[i])} if attack.active else {})}
               for i, name in enumerate(fed.client_names)}
    early = ({"round": sim.stopped_early, "patience": sim.config.train.patience,
              "min_delta": sim.config.train.min_delta} if sim.stopped_early is not None else None)
    chosen = {metric: {"val_mean": best.get(f"val_{metric}_mean"), "test_mean": best.get(f"test_{metric}_mean")}
              for metric in sim.metrics}
    noise = [sim.noise_check.warning] if sim.noise_check.warning else []  # the pre-flight's: every reader needs it
    return {"per_client": clients, "flags": flags(fed.metric, clients) + noise,
            "trivial_test_mean": mean_std(sim.trivial[fed.train_client_ids])[0], "stopped_early": early,
            "target_scale": fed.target_scale, "target_units": fed.target_units,
            "models_note": sim.models_note, "metrics": chosen or None, "select_by": sim.select_by}


def privacy_record(sim: Simulator) -> dict[str, Any]:
    """What the run spent, from the accounting library over every release it made (its ledger, not the rounds it
    evaluated): central, epsilon over the noised sums released; local, each client's epsilon over the noised uploads
    it made (novel clients' adaptation included)."""
    plan, ledger = sim.privacy, sim.ledger
    record = {**plan.record(), "noise_check": sim.noise_check.record()}
    if plan.mechanism == "central":
        record["rounds_released"] = ledger.central_releases
        record["epsilon"] = plan.epsilon_of_rounds(ledger.central_releases)
        if sim.tracker.clip_norm is not None:
            record["final_clip_norm"] = sim.tracker.clip_norm
        return record
    fed = sim.setup.federation
    uploaded = [i for i in range(fed.num_clients) if not fed.novel_mask[i] or ledger.uploads.get(i)]
    epsilons = {fed.client_names[i]: plan.epsilon_of_rounds(ledger.uploads.get(i, 0)) for i in uploaded}
    values = sorted(epsilons.values())
    record.update(epsilon_max=values[-1], epsilon_median=values[len(values) // 2], per_client_epsilon=epsilons,
                  uploads_released=sum(ledger.uploads.values()))
    return record


def graph_record(sim: Simulator) -> dict[str, Any]:
    """Which client graph the run read (``dataset.graph``; "none" also when the dataset has none) and its size."""
    graph = sim.setup.federation.client_graph
    if graph is None:
        return {"source": "none", "edges": 0}
    return {"source": sim.config.dataset.graph, "edges": int(torch.count_nonzero(graph)) // 2}


def build_result(sim: Simulator, history: list[dict[str, Any]], status: str,
                 novel_adapted: tuple[float | None, float | None]) -> RunResult:
    cfg, fed, setup, tracker = sim.config, sim.setup.federation, sim.setup, sim.tracker
    best = tracker.best or {}
    last = history[-1] if history else {}
    late_ids, straggler_ids = sim.participation.late_ids, sim.participation.straggler_ids
    return RunResult(**{
        "schema_version": runs.SCHEMA_VERSION,
        "method": cfg.method.name, "dataset": fed.name, "metric": fed.metric, "seed": cfg.seed,
        # every option the method ran with, defaults included (config.yaml keeps only what was set)
        "method_options": setup.method.options.model_dump(mode="json"),
        "status": status,
        "test_mean": best.get("test_mean"), "test_std": best.get("test_std"),
        "test_pooled": best.get("test_pooled"), "val_mean": best.get("val_mean"),
        "test_row_se": best.get("test_row_se"),
        "test_nonfinite_clients": best.get("test_nonfinite_clients", []),
        "test_mae": best.get("test_mae"), "test_mae_original_units": best.get("test_mae_original_units"),
        "novel_mean": best.get("novel_mean"), "novel_std": best.get("novel_std"),
        **({"test_by_architecture": best.get("test_by_architecture"),
            "architectures": dict(zip(fed.client_names, (setup.family.names[int(a)]
                                                         for a in setup.family.assignment), strict=True))}
           if setup.family is not None else {}),
        "novel_adapted_mean": novel_adapted[0], "novel_adapted_std": novel_adapted[1],
        # no novel score: the method has no model for a client that never trained (None: it has one)
        "novel_none_reason": type(setup.method).no_novel_model if len(fed.novel_client_ids) else None,
        "attack": setup.clients.attack.describe(fed.client_names),
        **{key: best.get(key) for key in ROBUSTNESS_FIELDS},
        "defense": cfg.defense.model_dump(mode="json"),
        "best_round": best.get("round"), "final_test_mean": last.get("test_mean"),
        **per_client(sim, best),
        "rounds": last.get("round", 0), "num_clients": fed.num_clients,
        "clients_per_round": sim.clients_per_round,
        "num_novel_clients": len(fed.novel_client_ids), "num_params": setup.spec.dim,
        "novel_clients": [fed.client_names[int(i)] for i in fed.novel_client_ids],
        **({"late_clients": [fed.client_names[int(i)] for i in late_ids], "join_round": cfg.train.join_round,
            "late_test_mean": best.get("late_test_mean"), "late_test_final": last.get("late_test_mean")}
           if len(late_ids) else {}),
        "client_graph": graph_record(sim),
        **({"dropout": cfg.train.dropout, "lost_uploads": tracker.lost_uploads,
            "dropped_clients": [{"round": r, "client": c, "reason": why} for r, c, why in tracker.dropped],
            "missed_rounds": runs.missed_rounds((int(r), str(c)) for r, c, _ in tracker.dropped)}
           if cfg.train.dropout > 0 or len(straggler_ids) else {}),
        **({"stragglers": [fed.client_names[int(i)] for i in straggler_ids],
            "straggler_delay": cfg.train.straggler_delay, "late_uploads": tracker.late_uploads}
           if len(straggler_ids) else {}),
        "scored_clients": best.get("scored_clients"), "training_clients": sim.num_train_clients,
        "unscored_clients": best.get("unscored_clients", []),
        **({"privacy": privacy_record(sim)} if sim.privacy.active else {}),
        "wall_seconds": round(tracker.elapsed, 3),
        "bytes_up": tracker.bytes_up, "bytes_down": tracker.bytes_down,
        "peak_rss_mb": peak_rss_mb(), "torch_threads": cfg.torch_threads,
        "device": str(setup.clients.device), "execution": sim.execution,
        "notes": list(setup.method.notes),
        # the code that produced these numbers (its engine's behaviour, its own modules): bench reruns a run whose
        # code changed since, and a report marks it stale
        "code": run_code(run_roots(cfg), private=cfg.privacy.mechanism != "none"),
        # what only the engine that ran the clients knows (Flower: dropped clients, refused nodes)
        **sim.executor.result_fields(),
    })


__all__ = ["ROBUSTNESS_FIELDS", "build_result", "flags", "peak_rss_mb"]
