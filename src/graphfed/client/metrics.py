"""The metrics a user chooses (``train.metrics``), per client, computed by scikit-learn from the client's predictions.

Accuracy (classification) and MSE (regression) are always scored by the vectorised evaluation
(:mod:`graphfed.client.evaluation`). The metrics here need each row's prediction, so they cost one more forward
pass per evaluation over the clients' val and test rows; each client's value comes from scikit-learn on that
client's rows alone. A metric a client's rows cannot define (AUROC with one class present, sensitivity without a
positive row) is NaN for that client and left out of the mean over clients; the per-client table shows it as "—".

Binary tasks (two classes) use the probability of class 1 for AUROC/AUPRC and ``train.threshold`` on it for
sensitivity (recall of class 1) and specificity (recall of class 0); with more classes AUROC and AUPRC are
one-vs-rest macro averages over the classes present in the client's rows, and sensitivity/specificity are
refused at config time.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import torch

from graphfed.client.placement import autocast
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit
from graphfed.models.base import TargetModel

CLASSIFICATION_METRICS = ("balanced_accuracy", "macro_f1", "auroc", "auprc", "sensitivity", "specificity")
REGRESSION_METRICS = ("rmse", "mae")
BINARY_ONLY = ("sensitivity", "specificity")
#: whether a larger value is better (model selection with ``train.select_by``)
HIGHER_IS_BETTER = {**dict.fromkeys(CLASSIFICATION_METRICS, True), "rmse": False, "mae": False,
                    "accuracy": True, "mse": False}


def _classification(name: str, y: np.ndarray, probabilities: np.ndarray, threshold: float) -> float:
    from sklearn import metrics as sk  # imported when a metric is scored: it adds 0.7 s to every run's start-up
    present = np.unique(y)
    predicted = probabilities.argmax(axis=1)
    binary = probabilities.shape[1] == 2
    if name == "balanced_accuracy":
        return float(sk.balanced_accuracy_score(y, predicted))
    if name == "macro_f1":
        return float(sk.f1_score(y, predicted, average="macro", labels=present, zero_division=0))
    if name in ("sensitivity", "specificity"):
        positive = (probabilities[:, 1] >= threshold).astype(int)
        wanted = 1 if name == "sensitivity" else 0
        if not (y == wanted).any():
            return math.nan
        return float(sk.recall_score(y, positive, pos_label=wanted, zero_division=0))
    if len(present) < 2:  # AUROC / AUPRC need both a positive and a negative row
        return math.nan
    if binary:
        score = sk.roc_auc_score if name == "auroc" else sk.average_precision_score
        return float(score(y, probabilities[:, 1]))
    if name == "auroc":
        scores = probabilities[:, present] / probabilities[:, present].sum(axis=1, keepdims=True)
        if len(present) == 2:
            return float(sk.roc_auc_score(y == present[1], scores[:, 1]))
        return float(sk.roc_auc_score(y, scores, multi_class="ovr", average="macro", labels=present))
    one_hot = (y[:, None] == present[None, :]).astype(int)
    return float(sk.average_precision_score(one_hot, probabilities[:, present], average="macro"))


def _regression(name: str, y: np.ndarray, outputs: np.ndarray) -> float:
    from sklearn import metrics as sk
    if name == "rmse":
        return float(np.sqrt(sk.mean_squared_error(y.reshape(len(y), -1), outputs.reshape(len(y), -1))))
    return float(sk.mean_absolute_error(y.reshape(len(y), -1), outputs.reshape(len(y), -1)))


def client_metrics(model: TargetModel, spec: ParamSpec, weights: torch.Tensor, data: ClientSplit, task: str,
                   names: tuple[str, ...], threshold: float = 0.5, precision: str = "fp32",
                   forward: Callable[[int, torch.Tensor], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """``{metric: [N]}`` for the clients of ``data`` (row ``i`` of ``weights`` is client ``i``'s model); NaN where a
    client has no rows or its rows cannot define the metric. ``forward(i, x)`` may replace the model's outputs."""
    values = {name: torch.full((data.num_clients,), math.nan) for name in names}
    for client in range(data.num_clients):
        x, y = data.client(client)
        if len(y) == 0:
            continue
        with torch.no_grad(), autocast(precision, x.device):
            outputs = (forward(client, x) if forward is not None
                       else model.batched_forward(spec.unflatten(weights[client:client + 1]), x.unsqueeze(0))[0])
        outputs = outputs.float().cpu()
        with warnings.catch_warnings():  # one-class clients: scikit-learn warns, the value is NaN-guarded above
            warnings.simplefilter("ignore")
            for name in names:
                if task == "classification":
                    probabilities = outputs.softmax(dim=-1).numpy()
                    values[name][client] = _classification(name, y.cpu().numpy(), probabilities, threshold)
                else:
                    values[name][client] = _regression(name, y.cpu().numpy(), outputs.numpy())
    return values
