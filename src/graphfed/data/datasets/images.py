"""Image data sets pooled and partitioned over clients: MNIST, Fashion-MNIST (and FedAGHN's case-study split of
it), CIFAR-10 (JPEG, or the official binary version) and CIFAR-100. Train and test images are pooled, dealt to
clients by ``dataset.partition`` and split per client by ``dataset.split``; the splits are cut from the pool in place
(no copy per client or per split)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from graphfed.config import ConfigError, DatasetConfig
from graphfed.data.datasets.idx import ImageSet
from graphfed.data.federation import Federation
from graphfed.data.registry import DatasetInfo, Streams, partition_description, split_pool


def _load_idx(folder: Path) -> ImageSet:
    from graphfed.data.datasets.idx import NUM_CLASSES, load_image_set

    return load_image_set(folder, NUM_CLASSES)


def _load_cifar10(folder: Path) -> ImageSet:
    from graphfed.data.datasets.cifar10 import load_cifar10

    return load_cifar10(folder)


def _load_cifar10_binary(folder: Path) -> ImageSet:
    from graphfed.data.datasets.cifar_binary import CIFAR10, load_cifar_binary

    return load_cifar_binary(folder.parent, CIFAR10)


def _load_cifar100(folder: Path, coarse: bool = False) -> ImageSet:
    from graphfed.data.datasets.cifar_binary import CIFAR100, load_cifar_binary

    return load_cifar_binary(folder.parent, CIFAR100, coarse)


@dataclass(frozen=True)
class ImageSource:
    """An image data set that is pooled and partitioned over clients like MNIST."""

    title: str  # how descriptions name it
    folder: str  # under the data directory
    load: Callable[[Path], ImageSet]  # the folder -> train and test pooled, float32 [N, C, H, W] in [0, 1]
    #: the publisher's layout, read when ``folder`` is absent (CIFAR-10: the official binary archive)
    fallback: ImageSource | None = None
    #: the publisher's class names, label k's at index k (None: the labels are their own names, e.g. MNIST's digits)
    classes: tuple[str, ...] | None = None

    def located(self, data_dir: Path) -> ImageSource:
        """This source, or its fallback when only the fallback's folder exists under ``data_dir``."""
        if self.fallback is not None and not (data_dir / self.folder).exists() \
                and (data_dir / self.fallback.folder).exists():
            return self.fallback
        return self


#: the publishers' class names (Xiao et al. 2017's Fashion-MNIST table; Krizhevsky's batches.meta for CIFAR-10)
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                         "Ankle boot")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

IMAGE_SOURCES = {
    "mnist": ImageSource("MNIST", "mnist", _load_idx),
    "fashion-mnist": ImageSource("Fashion-MNIST", "fashion-mnist", _load_idx, classes=FASHION_MNIST_CLASSES),
    "fashion-mnist-casestudy": ImageSource("Fashion-MNIST", "fashion-mnist", _load_idx,
                                           classes=FASHION_MNIST_CLASSES),
    # the JPEG re-encoding keeps its numbers where it exists; the official binary version is read otherwise
    "cifar10": ImageSource("CIFAR-10 (JPEG)", "cifar10-jpeg", _load_cifar10,
                           ImageSource("CIFAR-10 (binary)", "cifar10", _load_cifar10_binary, classes=CIFAR10_CLASSES),
                           classes=CIFAR10_CLASSES),
    "cifar100": ImageSource("CIFAR-100 (binary, fine labels)", "cifar100", _load_cifar100),
    "cifar100-coarse": ImageSource("CIFAR-100 (binary, coarse labels)", "cifar100",
                                   lambda folder: _load_cifar100(folder, coarse=True)),
}


def image_clients(cfg: DatasetConfig, rng: np.random.Generator,
                   ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], torch.Tensor | None, str, int]:
    """The pooled images and labels of ``IMAGE_SOURCES[cfg.name]``, each client's row indices into them, client
    groups (case study only), a description and the number of classes."""
    from graphfed.data.datasets.digits import partition_indices
    from graphfed.data.datasets.idx import (
        CASESTUDY_GROUP_FRACTION,
        CASESTUDY_GROUPS,
        DEFAULT_NUM_CLIENTS,
        group_class_partition,
    )

    num_clients = cfg.num_clients or DEFAULT_NUM_CLIENTS
    casestudy = cfg.name == "fashion-mnist-casestudy"
    if casestudy and num_clients < CASESTUDY_GROUPS:  # checked before the (seconds-long) load
        raise ConfigError(f"dataset.num_clients: {cfg.name} needs at least {CASESTUDY_GROUPS} clients "
                          f"(one per group), got {num_clients}")
    name = "cifar100-coarse" if cfg.name == "cifar100" and cfg.labels == "coarse" else cfg.name
    source = IMAGE_SOURCES[name].located(cfg.resolved_data_dir())
    images = source.load(cfg.resolved_data_dir() / source.folder)
    groups: torch.Tensor | None = None
    if casestudy:
        split = group_class_partition(images.y, num_clients, CASESTUDY_GROUPS, CASESTUDY_GROUP_FRACTION, rng)
        parts = split.clients
        groups = torch.as_tensor(split.client_groups, dtype=torch.int64)
        owned = "; ".join(f"group {g}: classes {', '.join(str(int(c)) for c in cls)}"
                          for g, cls in enumerate(split.group_classes))
        description = (f"Fashion-MNIST case study: {num_clients} clients in {CASESTUDY_GROUPS} groups; "
                       f"{CASESTUDY_GROUP_FRACTION:.0%} of 70k images dealt by group classes ({owned}), "
                       f"the rest IID over all clients (dataset.partition is not used)")
    else:
        parts = partition_indices(images.y, cfg, num_clients, rng)
        description = (f"{source.title}: {len(images.y)} images (train+test) over {num_clients} clients, "
                       f"{partition_description(cfg)}")
    return images.x, images.y, parts, groups, description, images.num_classes


def build(cfg: DatasetConfig, streams: Streams) -> Federation:
    pool_x, pool_y, parts, groups, description, output_dim = image_clients(cfg, streams.partition)
    train, val, test = split_pool(pool_x, pool_y, parts, cfg, "classification", streams.split)
    classes = IMAGE_SOURCES[cfg.name].classes
    return Federation(name=cfg.name, task="classification", train=train, val=val, test=test,
                      input_shape=tuple(pool_x.shape[1:]), output_dim=output_dim, metric="accuracy",
                      description=description, client_groups=groups,
                      class_names=list(classes) if classes is not None else None)


def _gray(cfg: DatasetConfig) -> tuple[tuple[int, ...], int]:
    return (1, 28, 28), 10


def _colour(cfg: DatasetConfig) -> tuple[tuple[int, ...], int]:
    if cfg.name != "cifar100":
        return (3, 32, 32), 10
    return (3, 32, 32), 100 if cfg.labels == "fine" else 20


REGISTRY = (
    DatasetInfo("mnist", "MNIST 28x28 digits, train+test pooled (70k), partitioned over dataset.num_clients clients "
                "(default 20, no graph)", "classification", build, _gray),
    DatasetInfo("fashion-mnist", "Fashion-MNIST 28x28, train+test pooled (70k), partitioned over dataset.num_clients "
                "clients (default 20, no graph)", "classification", build, _gray),
    DatasetInfo("fashion-mnist-casestudy", "Fashion-MNIST in FedAGHN's case-study split: 20 clients in 5 groups of "
                "4; 80% of the data by group classes, 20% IID; client groups recorded", "classification", build,
                _gray),
    DatasetInfo("cifar10", "CIFAR-10 32x32 RGB, 10 classes, train+test pooled (60k), partitioned over "
                "dataset.num_clients clients (default 20, no graph); the JPEG re-encoding (cifar10-jpeg/, decoded "
                "once into a cached .npz) where present, else the official binary version (cifar10/)",
                "classification", build, _colour),
    DatasetInfo("cifar100", "CIFAR-100 32x32 RGB (official binary version), 100 fine classes (dataset.labels: "
                "coarse for the 20 superclasses), train+test pooled (60k), partitioned over dataset.num_clients "
                "clients (default 20, no graph)", "classification", build, _colour),
)
