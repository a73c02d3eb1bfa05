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
from graphfed.report.tables import plain, unit_factor, versus_trivial
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


def flags(metric: str, per_client: dict[str, dict[str, Any]], target_scale: float | None = None,
          target_units: str | None = None) -> list[str]:
    """One sentence per thing a reader of this run's numbers must know (logged at the end of the run); scores as
    the tables print them (accuracy in %, errors in the units the federation declares)."""
    higher = HIGHER_IS_BETTER[metric]
    declared = target_scale is not None and target_units is not None and not higher

    def shown(value: float) -> str:
        if metric == "accuracy":
            return f"{100 * value:.2f} %"
        if declared:
            squared = "²" if metric == "mse" else ""
            return f"{plain(value * unit_factor(metric, target_scale or 1.0))} ({target_units}){squared}"
        return plain(value)
    novel = {name: scores for name, scores in per_client.items() if scores.get("novel")}
    trained = {name: scores for name, scores in per_client.items() if not scores.get("novel")}
    isolated = [name for name, scores in novel.items() if scores.get("no_graph_neighbours")]

    def against_trivial(clients: dict[str, dict[str, Any]], relation: str) -> list[str]:
        return [f"{name} ({shown(scores['test'])} against {shown(scores['trivial_test'])})"
                for name, scores in clients.items()
                if versus_trivial(scores.get("test"), scores.get("trivial_test"), higher) == relation]

    below, trained_below = against_trivial(novel, "below"), against_trivial(trained, "below")
    trained_ties = against_trivial(trained, "ties")

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
                     f"features' scales: graphfed inspect flags them, dataset.standardize: pooled, or client under "
                     f"DP, fixes them)")
    scored = [scores for scores in trained.values() if scores.get("test") is not None]
    if scored and len(trained_ties) == len(scored):
        found.append(f"every trained client scores exactly its trivial predictor {predictor}: the model predicts "
                     f"what that guess predicts and beats it nowhere (check the features' scales: graphfed inspect "
                     f"flags them)")
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
    # the pre-flight's warning, a flag where the scores bear it out (it is in the log and privacy.noise_check anyway)
    trivial_mean = mean_std(sim.trivial[fed.train_client_ids])[0]
    learned = versus_trivial(best.get("test_mean"), trivial_mean, HIGHER_IS_BETTER[fed.metric]) is None
    noise = (["the trained clients do not beat their trivial predictors, as the privacy pre-flight warned before "
              "round 1 (privacy.noise_check.warning names what lowers the noise)"]
             if sim.noise_check.warning and not learned else [])
    return {"per_client": clients, "flags": flags(fed.metric, clients, fed.target_scale, fed.target_units) + noise,
            "trivial_test_mean": trivial_mean, "stopped_early": early,
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
        spent = {"every client": record["epsilon"]}
    else:
        fed = sim.setup.federation
        uploaded = [i for i in range(fed.num_clients) if not fed.novel_mask[i] or ledger.uploads.get(i)]
        spent = {fed.client_names[i]: plan.epsilon_of_rounds(ledger.uploads.get(i, 0)) for i in uploaded}
        values = sorted(spent.values())
        record.update(epsilon_max=values[-1], epsilon_median=values[len(values) // 2], per_client_epsilon=spent,
                      uploads_released=sum(ledger.uploads.values()))
    if plan.target_epsilon is not None:
        record["above_target"] = plan.above_target(spent)
    return record


def target_flags(record: dict[str, Any] | None) -> list[str]:
    """The flag of a private run whose clients spent more than its ``privacy.target_epsilon`` (the CLI also ends
    such a run with a closing line and exit 6)."""
    above = (record or {}).get("above_target")
    if not above:
        return []
    shown = ", ".join(f"{name} ε {value:.3g}" for name, value in list(above.items())[:10])
    more = f" and {len(above) - 10} more" if len(above) > 10 else ""
    return [f"privacy budget exceeded: {shown}{more} above privacy.target_epsilon {record['target_epsilon']:g} "
            f"(the releases in privacy.json are more than the noise was sized for)"]


def graph_record(sim: Simulator) -> dict[str, Any]:
    """Which client graph the run read (``dataset.graph``; "none" also when the dataset has none) and its size."""
    graph = sim.setup.federation.client_graph
    if graph is None:
        return {"source": "none", "edges": 0}
    return {"source": sim.config.dataset.graph, "edges": int(torch.count_nonzero(graph)) // 2}


def time_to_target(history: list[dict[str, Any]], target: float, higher: bool) -> dict[str, Any]:
    """The first evaluated round whose test mean reached ``target``, and its simulated time (None: never)."""
    reached = next((record for record in history if record.get("test_mean") is not None
                    and (record["test_mean"] >= target if higher else record["test_mean"] <= target)), None)
    return {"target": target, "round": None if reached is None else reached["round"],
            "sim_seconds": None if reached is None else reached.get("sim_seconds")}


def build_result(sim: Simulator, history: list[dict[str, Any]], status: str,
                 novel_adapted: tuple[float | None, float | None]) -> RunResult:
    cfg, fed, setup, tracker = sim.config, sim.setup.federation, sim.setup, sim.tracker
    best = tracker.best or {}
    last = history[-1] if history else {}
    late_ids, straggler_ids = sim.participation.late_ids, sim.participation.straggler_ids
    privacy = privacy_record(sim) if sim.privacy.active else None
    clients = per_client(sim, best)
    clients["flags"] += target_flags(privacy)
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
        **clients,
        "rounds": last.get("round", 0), "num_clients": fed.num_clients, "sim_seconds": tracker.sim_seconds,
        **({"asynchronous": sim.async_server.record()} if sim.async_server is not None else {}),
        **({"time_to_target": time_to_target(history, cfg.train.target_score, HIGHER_IS_BETTER[fed.metric])}
           if cfg.train.target_score is not None else {}),
        **({"stopped_at_time": {"round": sim.stopped_at_time, "time_budget": cfg.train.time_budget,
                                "sim_seconds": tracker.sim_seconds}} if sim.stopped_at_time is not None else {}),
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
        **({"privacy": privacy} if privacy is not None else {}),
        "wall_seconds": round(tracker.elapsed, 3),
        "bytes_up": tracker.bytes_up, "bytes_down": tracker.bytes_down,
        "peak_rss_mb": peak_rss_mb(), "torch_threads": cfg.torch_threads,
        "device": str(setup.clients.device), "execution": sim.execution,
        "notes": list(setup.method.notes),
        # the pretrained base the clients started from (model.base): its file, SHA-256 and provenance
        **({"model_base": setup.clients.model.base_record} if hasattr(setup.clients.model, "base_record") else {}),
        # the code that produced these numbers (its engine's behaviour, its own modules): bench reruns a run whose
        # code changed since, and a report marks it stale
        "code": run_code(run_roots(cfg), private=cfg.privacy.mechanism != "none"),
        # what only the engine that ran the clients knows (Flower: dropped clients, refused nodes)
        **sim.executor.result_fields(),
    })


__all__ = ["ROBUSTNESS_FIELDS", "build_result", "flags", "peak_rss_mb", "target_flags"]
