"""IDX image loader, MNIST / Fashion-MNIST federations (incl. FedAGHN's case study) and the cnn-bn model."""

from __future__ import annotations

import copy
import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from graphfed.client.evaluation import evaluate_clients
from graphfed.config import ConfigError, DatasetConfig
from graphfed.core.params import ParamSpec
from graphfed.data import DATASETS, Federation, build_federation
from graphfed.data.datasets.digits import partition_indices
from graphfed.data.datasets.idx import (
    IMAGES_MAGIC,
    LABELS_MAGIC,
    find_idx_file,
    group_class_partition,
    load_image_set,
    read_idx,
)
from graphfed.data.federation import ClientSplit
from graphfed.models import MODELS, build_model
from graphfed.models.cnn_bn import CNNBN, PaddingAwareBatchNorm2d, normalised, padding_aware_batch_norm

SHARED_DATA = (Path(__file__).parents[1] / "../shared/data").resolve()


def _has_idx(folder: str) -> bool:
    try:
        find_idx_file(SHARED_DATA / folder, "train", "images")
    except FileNotFoundError:
        return False
    return True


needs_mnist = pytest.mark.skipif(not _has_idx("mnist"), reason=f"real MNIST IDX files not found under "
                                 f"{SHARED_DATA / 'mnist'} (the shared data folder is absent)")
needs_fmnist = pytest.mark.skipif(not _has_idx("fashion-mnist"), reason=f"real Fashion-MNIST IDX files not found "
                                  f"under {SHARED_DATA / 'fashion-mnist'} (the shared data folder is absent)")

MNIST_CLASS_COUNTS = [6903, 7877, 6990, 7141, 6824, 6313, 6876, 7293, 6825, 6958]  # train + t10k


# --- tiny IDX fixtures ---------------------------------------------------------------------------------


def idx_bytes(magic: int, array: np.ndarray) -> bytes:
    """Uncompressed IDX: magic, one big-endian uint32 per dimension, then the unsigned bytes."""
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return magic.to_bytes(4, "big") + dims + array.astype(np.uint8).tobytes()


def write_gz(path: Path, payload: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload))
    return path


def write_image_folder(folder: Path, sep: str = "-", seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Tiny train (5) and t10k (3) parts of 4x3 images; returns the pooled raw (uint8 images, labels)."""
    rng = np.random.default_rng(seed)
    parts = {"train": 5, "t10k": 3}
    images, labels = [], []
    for part, n in parts.items():
        x = rng.integers(0, 256, size=(n, 4, 3), dtype=np.uint8)
        x[0, 0, 0], x[-1, -1, -1] = 0, 255  # both ends of the range
        y = rng.integers(0, 10, size=n, dtype=np.uint8)
        write_gz(folder / f"{part}-images{sep}idx3-ubyte.gz", idx_bytes(IMAGES_MAGIC, x))
        write_gz(folder / f"{part}-labels{sep}idx1-ubyte.gz", idx_bytes(LABELS_MAGIC, y))
        images.append(x)
        labels.append(y)
    return np.concatenate(images), np.concatenate(labels)


@pytest.mark.parametrize("sep", ["-", "."])
def test_loader_reads_tiny_fixture_exactly(tmp_path: Path, sep: str) -> None:
    """Both file-name spellings; images / 255 as float32 [N, 1, H, W], train rows first, int64 labels."""
    raw_x, raw_y = write_image_folder(tmp_path, sep)
    images = load_image_set(tmp_path)
    assert images.x.dtype == np.float32 and images.x.shape == (8, 1, 4, 3)
    np.testing.assert_array_equal(images.x[:, 0], raw_x.astype(np.float32) / np.float32(255.0))
    assert images.x.min() == 0.0 and images.x.max() == 1.0
    assert images.y.dtype == np.int64
    np.testing.assert_array_equal(images.y, raw_y)


@pytest.mark.parametrize(("damage", "problem"), [
    (lambda raw: raw[:-7], "truncated"),
    (lambda raw: raw[:10], "truncated IDX header"),
    (lambda raw: raw + b"\x00\x01", "trailing bytes"),
    (lambda raw: (0x00000804).to_bytes(4, "big") + raw[4:], "magic"),
    (lambda raw: LABELS_MAGIC.to_bytes(4, "big") + raw[4:], "magic"),
])
def test_damaged_idx_payload_raises_value_error_naming_file(tmp_path: Path, damage: Callable[[bytes], bytes],
                                                            problem: str) -> None:
    raw = idx_bytes(IMAGES_MAGIC, np.zeros((3, 4, 4), dtype=np.uint8))
    path = write_gz(tmp_path / "train-images-idx3-ubyte.gz", damage(raw))
    with pytest.raises(ValueError, match=problem) as err:
        read_idx(path, IMAGES_MAGIC)
    assert str(path) in str(err.value)


def test_truncated_gzip_stream_raises_value_error_naming_file(tmp_path: Path) -> None:
    write_image_folder(tmp_path)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-12])  # cut the gzip trailer and part of the stream
    with pytest.raises(ValueError, match="gzip") as err:
        load_image_set(tmp_path)
    assert str(path) in str(err.value)
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="gzip"):
        load_image_set(tmp_path)


def test_inconsistent_parts_raise_value_error(tmp_path: Path) -> None:
    write_image_folder(tmp_path)
    labels = tmp_path / "train-labels-idx1-ubyte.gz"
    write_gz(labels, idx_bytes(LABELS_MAGIC, np.zeros(4, dtype=np.uint8)))  # 5 images, 4 labels
    with pytest.raises(ValueError, match="5 images but"):
        load_image_set(tmp_path)
    write_gz(labels, idx_bytes(LABELS_MAGIC, np.array([0, 1, 2, 3, 10], dtype=np.uint8)))
    with pytest.raises(ValueError, match=r"label 10 outside 0\.\.9"):
        load_image_set(tmp_path)


def test_missing_file_raises_file_not_found_with_hint(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "fashion-mnist")
    (tmp_path / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_image_set(tmp_path / "fashion-mnist")
    msg = str(err.value)
    assert str(tmp_path / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz") in msg
    assert "dataset.data_dir" in msg and "GRAPHFED_DATA" in msg
    with pytest.raises(FileNotFoundError, match=r"dataset\.data_dir"):
        build_federation(DatasetConfig(name="mnist", data_dir=str(tmp_path)), seed=0)


def test_fixture_folder_builds_a_federation(tmp_path: Path) -> None:
    """The registry wiring on generated files: 4 clients, every image in exactly one split row."""
    write_image_folder(tmp_path / "mnist", seed=3)
    fed = build_federation(DatasetConfig(name="mnist", data_dir=str(tmp_path), num_clients=2, partition="iid",
                                         min_samples_per_client=1), seed=0)
    assert fed.input_shape == (1, 4, 3) and fed.output_dim == 10 and fed.metric == "accuracy"
    assert fed.client_graph is None and fed.client_groups is None
    assert int(sum(s.counts.sum() for s in (fed.train, fed.val, fed.test))) == 8


def test_registry_has_image_datasets_and_model() -> None:
    for name in ("mnist", "fashion-mnist", "fashion-mnist-casestudy"):
        assert DATASETS[name].task == "classification"
    assert "cnn-bn" in MODELS


# --- partitions (label arrays only, cheap) -------------------------------------------------------------


def test_group_class_partition_on_toy_labels() -> None:
    labels = np.repeat(np.arange(10), 100)
    split = group_class_partition(labels, 20, 5, 0.8, np.random.default_rng(0))
    np.testing.assert_array_equal(split.client_groups, np.repeat(np.arange(5), 4))
    assert [c.tolist() for c in split.group_classes] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    np.testing.assert_array_equal(np.sort(np.concatenate(split.clients)), np.arange(1000))
    assert sum(len(p) for p in split.group_parts) == 800
    for client, part in enumerate(split.group_parts):
        g = split.client_groups[client]
        assert set(np.unique(labels[part])) <= {2 * g, 2 * g + 1}
        assert np.isin(part, split.clients[client]).all()
    with pytest.raises(ValueError, match="cannot form"):
        group_class_partition(labels, 4, 5, 0.8, np.random.default_rng(0))


@pytest.fixture(scope="module")
def fmnist_labels() -> np.ndarray:
    folder = SHARED_DATA / "fashion-mnist"
    return np.concatenate([read_idx(find_idx_file(folder, part, "labels"), LABELS_MAGIC).astype(np.int64)
                           for part in ("train", "t10k")])


@needs_fmnist
@pytest.mark.parametrize("scheme", ["iid", "pathological", "dirichlet"])
def test_real_partitions_cover_every_sample_once(fmnist_labels: np.ndarray, scheme: str) -> None:
    assert len(fmnist_labels) == 70_000
    np.testing.assert_array_equal(np.bincount(fmnist_labels), [7000] * 10)
    cfg = DatasetConfig(name="fashion-mnist", partition=scheme, dirichlet_beta=0.1)
    parts = partition_indices(fmnist_labels, cfg, 20, np.random.default_rng(0))
    assert len(parts) == 20 and min(len(p) for p in parts) >= cfg.min_samples_per_client
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(70_000))
    if scheme == "dirichlet":
        # Padding goes to the largest client: with Dir(0.1) over 10 classes it stays a few times the mean.
        assert max(len(p) for p in parts) < 6 * 3500


@needs_fmnist
def test_real_case_study_partition_group_parts_hold_only_group_classes(fmnist_labels: np.ndarray) -> None:
    split = group_class_partition(fmnist_labels, 20, 5, 0.8, np.random.default_rng(0))
    np.testing.assert_array_equal(np.sort(np.concatenate(split.clients)), np.arange(70_000))
    for client, part in enumerate(split.group_parts):
        g = split.client_groups[client]
        assert set(np.unique(fmnist_labels[part]).tolist()) == {2 * g, 2 * g + 1}
        assert abs(len(part) - 2800) < 150  # 80% of 14k group images / 4 clients, up to sampling noise


# --- real federations -----------------------------------------------------------------------------------


def _pooled_labels(fed: Federation, client: int) -> np.ndarray:
    return np.concatenate([split.client(client)[1].numpy() for split in (fed.train, fed.val, fed.test)])


@needs_mnist
def test_real_mnist_federation_shapes_range_and_label_counts() -> None:
    fed = build_federation(DatasetConfig(name="mnist", data_dir=str(SHARED_DATA), partition="iid"), seed=0)
    assert fed.num_clients == 20 and fed.input_shape == (1, 28, 28) and fed.output_dim == 10
    assert fed.client_graph is None and fed.client_groups is None
    assert fed.train.x.shape == (49_000, 1, 28, 28) and fed.train.counts.tolist() == [2450] * 20
    assert fed.train.x.dtype == torch.float32
    assert float(fed.train.x.min()) == 0.0 and float(fed.train.x.max()) == 1.0
    labels = np.concatenate([_pooled_labels(fed, i) for i in range(fed.num_clients)])
    assert len(labels) == 70_000
    np.testing.assert_array_equal(np.bincount(labels, minlength=10), MNIST_CLASS_COUNTS)


@needs_fmnist
def test_real_case_study_federation_records_groups_and_group_classes_dominate() -> None:
    fed = build_federation(DatasetConfig(name="fashion-mnist-casestudy", data_dir=str(SHARED_DATA)), seed=0)
    assert fed.num_clients == 20 and fed.client_graph is None and fed.input_shape == (1, 28, 28)
    assert fed.client_groups is not None and fed.client_groups.dtype == torch.int64
    assert fed.client_groups.tolist() == [g for g in range(5) for _ in range(4)]
    total = 0
    for client in range(fed.num_clients):
        labels = _pooled_labels(fed, client)
        total += len(labels)
        g = int(fed.client_groups[client])
        hist = np.bincount(labels, minlength=10)
        # 80% group part + the group's 2/10 share of the 20% IID part = 84% expected.
        assert hist[2 * g: 2 * g + 2].sum() / len(labels) >= 0.8
        assert np.all(np.delete(hist, [2 * g, 2 * g + 1]) > 0)  # the IID part reaches every class
    assert total == 70_000
    with pytest.raises(ConfigError, match="at least 5 clients"):
        build_federation(DatasetConfig(name="fashion-mnist-casestudy", data_dir=str(SHARED_DATA),
                                       num_clients=4), seed=0)


# --- cnn-bn -----------------------------------------------------------------------------------------------


def _client_params(model: CNNBN, num_clients: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """Different weights per client: the model's init plus a per-client perturbation."""
    g = torch.Generator().manual_seed(seed)
    return {name: p.detach() + 0.1 * torch.randn(num_clients, *p.shape, generator=g)
            for name, p in model.named_parameters()}


def _module_forward(model: CNNBN, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Reference: client s's weights copied into a plain module, called on client s's rows."""
    outputs = []
    for s in range(x.shape[0]):
        module = copy.deepcopy(model)
        with torch.no_grad():
            for name, value in params.items():
                module.get_parameter(name).copy_(value[s])
        outputs.append(module(x[s]))
    return torch.stack(outputs).detach()


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("path", ["batched_forward", "vmap_forward"])
def test_cnn_bn_batched_forward_matches_per_client_loop(training: bool, path: str) -> None:
    """[S, B, 1, 28, 28] through the batched path (loop) and through vmap equals S separate module calls."""
    torch.manual_seed(0)
    model = CNNBN((1, 28, 28), 10)
    model.train(training)
    assert list(model.buffers()) == []  # BN keeps no running statistics
    assert {"bn1.weight", "bn1.bias", "bn2.weight", "bn2.bias"} <= set(dict(model.named_parameters()))
    params = _client_params(model, 3)
    x = torch.rand(3, 16, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    x[1, 10:] = 0.0  # client 1 carries padding rows
    batched = getattr(model, path)(params, x)
    assert batched.shape == (3, 16, 10)
    torch.testing.assert_close(batched, _module_forward(model, params, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", ["batched_forward", "vmap_forward"])
def test_cnn_bn_gradients_match_per_client_autograd(path: str) -> None:
    torch.manual_seed(0)
    model = CNNBN((1, 28, 28), 10, channels=4, hidden=16)
    params = {n: v.requires_grad_(True) for n, v in _client_params(model, 2).items()}
    x = torch.rand(2, 8, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    y = torch.randint(0, 10, (2, 8), generator=torch.Generator().manual_seed(4))
    loss = F.cross_entropy(getattr(model, path)(params, x).reshape(16, 10), y.reshape(16), reduction="sum")
    grads = torch.autograd.grad(loss, list(params.values()))
    for s in range(2):
        own = {n: v[s].detach().clone().requires_grad_(True) for n, v in params.items()}
        ref = torch.autograd.grad(F.cross_entropy(functional_call(model, own, (x[s],)), y[s], reduction="sum"),
                                  list(own.values()))
        for g_batched, g_ref in zip(grads, ref, strict=True):
            torch.testing.assert_close(g_batched[s], g_ref, atol=1e-5, rtol=1e-4)


def test_padding_aware_bn_equals_plain_batch_norm_and_ignores_padding_rows() -> None:
    torch.manual_seed(0)
    bn = PaddingAwareBatchNorm2d(5)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    h = torch.randn(7, 5, 6, 6) * 3 + 1
    reference = F.batch_norm(h, None, None, bn.weight, bn.bias, training=True, eps=bn.eps)
    torch.testing.assert_close(bn(h), reference, atol=1e-5, rtol=1e-5)
    padded = torch.cat([h, torch.zeros(4, 5, 6, 6)])
    valid = torch.arange(11) < 7
    torch.testing.assert_close(bn(padded, valid)[:7], reference, atol=1e-5, rtol=1e-5)
    empty = bn(torch.zeros(3, 5, 6, 6), torch.zeros(3, dtype=torch.bool))  # a client without rows
    assert torch.isfinite(empty).all()


def test_padding_aware_bn_with_every_row_counting_skips_the_mask_with_the_same_bits() -> None:
    """A batch whose rows all count (every training batch) is normalised without the mask's multiplications: the
    same bits as multiplying by an all-ones mask, forward and backward; one uncounted row puts the mask back."""
    torch.manual_seed(0)
    h = (torch.randn(6, 4, 5, 5) * 2 + 1).requires_grad_()
    weight, bias = torch.rand(4) + 0.5, torch.rand(4) - 0.5
    fast = padding_aware_batch_norm(h, weight, bias, torch.ones(6, dtype=torch.bool), 1e-5)
    masked = normalised(h, torch.ones(6, 1, 1, 1), torch.tensor(6.0 * 25), weight, bias, 1e-5)
    assert torch.equal(fast, masked)
    upstream = torch.randn_like(fast)
    assert torch.equal(torch.autograd.grad(fast, h, upstream)[0], torch.autograd.grad(masked, h, upstream)[0])
    one_left_out = torch.arange(6) < 5
    torch.testing.assert_close(padding_aware_batch_norm(h, weight, bias, one_left_out, 1e-5)[:5],
                               F.batch_norm(h[:5], None, None, weight, bias, training=True, eps=1e-5))


def test_cnn_bn_evaluation_on_padded_clients_equals_unpadded_forward() -> None:
    """evaluate_clients feeds zero-padded splits: BN statistics must come from the real rows only."""
    torch.manual_seed(0)
    model = CNNBN((1, 28, 28), 10, channels=4, hidden=16)
    model.eval()
    counts = [9, 3, 14]
    g = torch.Generator().manual_seed(5)
    xs = [torch.rand(n, 1, 28, 28, generator=g) for n in counts]
    ys = [torch.randint(0, 10, (n,), generator=g) for n in counts]
    data = ClientSplit.from_lists(xs, ys, "classification")
    spec = ParamSpec.from_module(model)
    params = _client_params(model, 3)
    weights = spec.flatten(params, batch_dims=1)
    scores = evaluate_clients(model, spec, weights, data, "classification")
    padded = model.vmap_forward(params, data.padded().x)
    for s in range(3):
        logits = functional_call(model, {n: v[s] for n, v in params.items()}, (xs[s],))
        torch.testing.assert_close(padded[s, : counts[s]], logits, atol=1e-5, rtol=1e-5)
        accuracy = (logits.argmax(-1) == ys[s]).float().mean()
        torch.testing.assert_close(scores.metric[s], accuracy)
        torch.testing.assert_close(scores.loss[s], F.cross_entropy(logits, ys[s]), atol=1e-5, rtol=1e-5)


def test_cnn_bn_registry_builds_for_image_federations() -> None:
    split = ClientSplit.from_lists([np.zeros((2, 1, 28, 28), np.float32)] * 2, [np.zeros(2, np.int64)] * 2,
                                   "classification")
    fed = Federation(name="toy", task="classification", train=split, val=split, test=split,
                     input_shape=(1, 28, 28), output_dim=10)
    model = build_model("cnn-bn", fed)
    assert isinstance(model, CNNBN) and model.fc1.in_features == 64 * 4 * 4
    assert sum(p.numel() for p in model.parameters()) == 582_218  # incl. 2 x (32 + 64) BN affine parameters
    with pytest.raises(ValueError, match="too small"):
        CNNBN((1, 8, 8), 10)
    with pytest.raises(ConfigError, match=r"model\.options"):
        build_model("cnn-bn", fed, {"width": 3})
