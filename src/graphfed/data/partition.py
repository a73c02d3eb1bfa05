"""Split one labelled pool of samples across clients, and each client's samples into train/val/test.

Every function takes its randomness from a passed ``np.random.Generator`` so a run is reproducible from
one seed, and none of them loops "until the draw looks fine": the running time is bounded by the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

SplitMode = Literal["random", "chronological"]


def _as_labels(labels: np.ndarray | Sequence[int]) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {arr.shape}")
    return arr


def _check_num_clients(num_clients: int, n: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if n < num_clients:
        raise ValueError(f"cannot give {num_clients} clients at least one sample each from {n} samples")


def iid_partition(labels: np.ndarray | Sequence[int], num_clients: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle all indices and deal them out in near-equal contiguous chunks (sizes differ by <= 1)."""
    labels = _as_labels(labels)
    _check_num_clients(num_clients, len(labels))
    perm = rng.permutation(len(labels))
    return [np.sort(chunk) for chunk in np.array_split(perm, num_clients)]


def pathological_partition(labels: np.ndarray | Sequence[int], num_clients: int, classes_per_client: int,
                           rng: np.random.Generator) -> list[np.ndarray]:
    """Give every client samples of exactly ``classes_per_client`` distinct classes (McMahan-style shards).

    Classes are handed out greedily to the least-used classes first (random tie-break), so every class is
    held by at least one client and class usage differs by at most one. Each class's samples are then
    shuffled and cut into equal shards, one per client holding it, so every sample is used exactly once.
    """
    labels = _as_labels(labels)
    classes = np.unique(labels)
    num_classes = len(classes)
    k = classes_per_client
    if k < 1:
        raise ValueError(f"classes_per_client must be >= 1, got {k}")
    if k > num_classes:
        raise ValueError(f"classes_per_client={k} exceeds the number of classes ({num_classes})")
    if num_clients * k < num_classes:
        # Some class would be left without a holder and its samples unused.
        raise ValueError(f"{num_clients} clients x {k} classes each cannot cover all {num_classes} classes; "
                         f"need num_clients * classes_per_client >= {num_classes}")

    usage = np.zeros(num_classes, dtype=np.int64)
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    for client in range(num_clients):
        # lexsort: primary key usage (least used first), secondary key a random tie-break.
        order = np.lexsort((rng.random(num_classes), usage))
        for c in order[:k]:
            usage[c] += 1
            holders[c].append(client)

    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, cls in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        if len(idx) < len(holders[c]):
            raise ValueError(f"class {cls!r} has {len(idx)} samples but {len(holders[c])} clients must each "
                             f"get at least one; lower num_clients or classes_per_client")
        for client, shard in zip(holders[c], np.array_split(idx, len(holders[c])), strict=True):
            parts[client].append(shard)
    return [np.sort(np.concatenate(p)) for p in parts]


def dirichlet_partition(labels: np.ndarray | Sequence[int], num_clients: int, beta: float,
                        rng: np.random.Generator, min_samples: int = 10) -> list[np.ndarray]:
    """Label-skewed partition: each class is spread over clients with proportions ~ Dir(beta).

    Smaller ``beta`` means more skew. Tiny beta with many clients leaves many clients (nearly) empty; rather
    than redrawing until every client is big enough (which may never happen), a deterministic repair moves
    randomly chosen samples from the currently largest client to each deficient client. The repair runs at
    most ``2 * num_clients`` steps: each step either fills a deficit or drains a donor down to
    ``min_samples``, and ``num_clients * min_samples <= len(labels)`` guarantees enough surplus exists.
    """
    labels = _as_labels(labels)
    n = len(labels)
    if beta <= 0:
        raise ValueError(f"dirichlet beta must be > 0, got {beta}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if min_samples < 0:
        raise ValueError(f"min_samples must be >= 0, got {min_samples}")
    if num_clients * min_samples > n:
        raise ValueError(f"{num_clients} clients x min_samples={min_samples} needs "
                         f"{num_clients * min_samples} samples but only {n} are available")

    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        props = rng.dirichlet(np.full(num_clients, beta))
        if not np.all(np.isfinite(props)) or props.sum() <= 0:
            # Extremely small beta can underflow every gamma draw; the limit of Dir(beta->0) is one-hot.
            props = np.zeros(num_clients)
            props[rng.integers(num_clients)] = 1.0
        cuts = (np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
        for client, chunk in enumerate(np.split(idx, cuts)):
            parts[client].append(chunk)
    clients = [np.concatenate(p) if p else np.zeros(0, dtype=np.int64) for p in parts]

    sizes = np.array([len(c) for c in clients], dtype=np.int64)
    for needy in np.flatnonzero(sizes < min_samples):
        while sizes[needy] < min_samples:
            donor = int(np.argmax(sizes))
            take = int(min(min_samples - sizes[needy], sizes[donor] - min_samples))
            if take <= 0:  # unreachable given the size check above; guards against an infinite loop
                raise RuntimeError("dirichlet repair ran out of surplus samples")
            moved = rng.choice(sizes[donor], size=take, replace=False)
            keep = np.ones(sizes[donor], dtype=bool)
            keep[moved] = False
            clients[needy] = np.concatenate([clients[needy], clients[donor][moved]])
            clients[donor] = clients[donor][keep]
            sizes[needy] += take
            sizes[donor] -= take
    return [np.sort(c) for c in clients]


def _split_sizes(n: int, fractions: Sequence[float]) -> tuple[int, int, int]:
    """Largest-remainder rounding (sizes sum to n exactly), then at least one train and one test row."""
    f = np.asarray(fractions, dtype=np.float64)
    if f.shape != (3,) or np.any(f < 0) or f.sum() <= 0:
        raise ValueError(f"fractions must be three non-negative numbers, got {tuple(fractions)}")
    raw = f / f.sum() * n
    sizes = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - sizes), kind="stable")
    sizes[order[: n - int(sizes.sum())]] += 1
    n_train, n_val, n_test = (int(s) for s in sizes)
    if n >= 2:
        # A client with no train or no test rows is useless to the simulator, whatever the fractions say.
        if n_train == 0:
            if n_val > 0:
                n_val -= 1
            else:
                n_test -= 1
            n_train = 1
        if n_test == 0:
            if n_val > 0:
                n_val -= 1
            else:
                n_train -= 1
            n_test = 1
    return n_train, n_val, n_test


def split_client_indices(n: int, fractions: Sequence[float] = (0.7, 0.1, 0.2),
                         rng: np.random.Generator | None = None,
                         mode: SplitMode = "random") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split ``range(n)`` into (train, val, test) index arrays.

    ``random`` shuffles first (needs ``rng``); ``chronological`` keeps the order, train first, then val,
    then test. With ``n >= 2`` there is always at least one train and one test index.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    n_train, n_val, _ = _split_sizes(n, fractions)
    if mode == "chronological":
        order = np.arange(n)
    elif mode == "random":
        if rng is None:
            raise ValueError("split mode 'random' needs an rng")
        order = rng.permutation(n)
    else:
        raise ValueError(f"split mode must be 'random' or 'chronological', got {mode!r}")
    train, val, test = np.split(order, [n_train, n_train + n_val])
    if mode == "random":
        train, val, test = np.sort(train), np.sort(val), np.sort(test)
    return train, val, test
