"""Shared fixtures: tiny run configs that finish in about a second on one CPU core."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import logging
import os
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from graphfed.config import RunConfig, load_config
from graphfed.data.federation import ClientSplit

# The real datasets sit beside the project (../shared/data) on developer machines and in CI; graphfed's own default
# is the user's data folder, so the tests name this one (subprocesses inherit it).
_SHARED_DATA = (Path(__file__).resolve().parents[1] / ".." / "shared" / "data").resolve()
if _SHARED_DATA.is_dir():
    os.environ.setdefault("GRAPHFED_DATA", str(_SHARED_DATA))

# Under pytest-xdist (make test runs one worker per core and one more) each worker takes its share of the cores
# (at least one thread): torch's default (all of them) in every worker would oversubscribe the machine. A run config's
# own torch_threads still wins.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _WORKER_THREADS = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(_WORKER_THREADS)
    # and the processes tests start (the CLI, Flower's nodes, the benchmarks' scripts): with torch's default each,
    # OpenMP teams spinning against the other workers made the quick GPU-script test 5x slower
    os.environ.setdefault("OMP_NUM_THREADS", str(_WORKER_THREADS))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` first. ``make test`` runs xdist's ``worksteal``, which hands the workers contiguous
    equal parts of this list and lets a worker that runs dry take queued tests from the end of a busy one's part: the
    first worker runs the slow ones (one Flower deployment at a time) while the others share the rest, and no slow
    test starts last, keeping one worker busy while the others wait. The Flower deployments mostly wait on their
    processes, so ``make test`` runs one worker more than the cores to fill the core they leave."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: each kind keeps its order


#: A federation and training budget small enough for unit tests, big enough to learn something.
TINY_BASE: list[str] = [
    "dataset.name=fln",
    "dataset.num_clients=12",
    "train.rounds=10",
    "train.local_steps=5",
    "train.batch_size=16",
    "train.clients_per_round=4",
    "train.eval_every=5",
    "train.checkpoint_every=5",
    "train.novel_adapt_rounds=2",
    "model.options={hidden: 8}",
]

#: Small server-side networks per method family, so hypernetwork methods stay fast.
TINY_METHOD_OPTIONS: dict[str, str] = {
    "pfedhn": "method.options={hidden: 16, embedding_dim: 4}",
    "panacea": "method.options={embedding_dim: 8, gnn_hidden: 16, hypernet_hidden: 16, server_steps: 2}",
    "panacea-gn": "method.options={embedding_dim: 8, gnn_hidden: 16, hypernet_hidden: 16, server_steps: 2}",
    "panacea-mlp": "method.options={embedding_dim: 8, hypernet_hidden: 16, server_steps: 2}",
}

ConfigFactory = Callable[..., RunConfig]


def on_kernel_paths(values: list[str], chosen: set[str] | tuple[str, ...]) -> list[Any]:
    """``values`` as test parameters, those in ``chosen`` marked ``kernel_paths``: ``make test`` re-runs them with
    MKL held to its AVX2 path, where a claim that holds only on this CPU's kernels fails."""
    return [pytest.param(value, marks=pytest.mark.kernel_paths) if value in chosen else value for value in values]


def single_architecture_methods() -> list[str]:
    """Registered methods that run on one architecture (FLHA-GHN and FLHA-distillation federate the clients' own
    architectures and need ``model.architectures``: ``tests/test_flha_ghn.py`` covers them)."""
    from graphfed.methods import METHODS

    return sorted(name for name, cls in METHODS.items() if cls.architectures not in ("ghn", "teacher"))


#: Methods that need another model than the tiny MLP: FedBN keeps BatchNorm local (MNIST from ../shared/data,
#: 1 % of its rows, a small CNN with BatchNorm)
TINY_METHOD_DATA: dict[str, list[str]] = {
    "fedbn": ["dataset.name=mnist", "dataset.client_fraction=0.01", "model.name=cnn-bn",
              "model.options={channels: 4, hidden: 16}"],
}


def tiny_overrides(method: str = "fedavg", *overrides: str) -> list[str]:
    """The ``--set`` list of a tiny run of ``method``; later ``overrides`` win."""
    extra = [TINY_METHOD_OPTIONS[method]] if method in TINY_METHOD_OPTIONS else []
    return [*TINY_BASE, f"method.name={method}", *extra, *TINY_METHOD_DATA.get(method, []), *overrides]


@pytest.fixture
def make_config() -> ConfigFactory:
    """Factory: ``make_config("panacea", "train.rounds=4")`` -> a validated tiny ``RunConfig``."""

    def make(method: str = "fedavg", *overrides: str) -> RunConfig:
        return load_config(None, tiny_overrides(method, *overrides))

    return make


def read_rounds(out_dir: Path) -> list[dict[str, Any]]:
    """The records of ``rounds.jsonl`` in order."""
    return [json.loads(line) for line in (out_dir / "rounds.jsonl").read_text().splitlines() if line.strip()]


def without_wall_time(record: Any) -> dict[str, Any]:
    """A run's result (or a round record) minus wall-clock time, peak memory and the autotune record (its timings,
    measured or read from the cache), the only fields allowed to differ between runs."""
    fields = record.to_json() if hasattr(record, "to_json") else record
    return {key: value for key, value in fields.items() if key not in ("wall_seconds", "peak_rss_mb", "execution")}


@pytest.fixture(autouse=True)
def _restore_root_logging() -> Iterator[None]:
    """The CLI reconfigures the root logger (``basicConfig(force=True)``) onto CliRunner's temporary streams;
    put the original handlers back so later tests never log into a closed stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True, scope="session")
def _single_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine OpenMP spin-waiting makes
    them up to 10x slower; one thread keeps the suite fast and its timing stable."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


#: models of text (a window of character classes -> the next one): the shakespeare federation's
TEXT_MODELS = ("char-transformer", "leaf-lstm")


def model_client_data(name: str, counts: tuple[int, ...], seed: int = 0) -> tuple[Any, ClientSplit]:
    """A federation shape and client rows any registered model trains on: 12-step series for ``gru``, 20 features for
    ``mlp``, 16-character windows for the text models, 3x16x16 images (4 classes) otherwise; ``counts[i]`` rows for
    client ``i``."""
    from types import SimpleNamespace

    generator = torch.Generator().manual_seed(seed)
    if name in TEXT_MODELS:  # windows of 16 characters of an 80-character alphabet, the next one to predict
        fed = SimpleNamespace(name="text", task="classification", input_shape=(16,), output_dim=80)
        xs = [torch.randint(0, 80, (count, 16), generator=generator).float() for count in counts]
        ys = [torch.randint(0, 80, (count,), generator=generator) for count in counts]
        return fed, ClientSplit.from_lists(xs, ys, fed.task)
    if name == "gru":
        fed = SimpleNamespace(name="series", task="regression", input_shape=(12,), output_dim=3)
        xs = [torch.randn(count, 12, generator=generator) for count in counts]
        ys = [x[:, -3:] * 0.5 for x in xs]
    else:
        shape = (20,) if name == "mlp" else (3, 16, 16)
        fed = SimpleNamespace(name="data", task="classification", input_shape=shape, output_dim=4)
        xs = [torch.randn(count, *shape, generator=generator) for count in counts]
        ys = [torch.arange(count) % 4 for count in counts]
    return fed, ClientSplit.from_lists(xs, ys, fed.task)


def model_and_rule(name: str, counts: tuple[int, ...]) -> tuple[Any, Any, ClientSplit, Any, torch.Tensor]:
    """Model ``name`` (seeded), its ParamSpec, :func:`model_client_data` (seed 1) of ``counts`` rows, a plain-SGD rule
    of 3 steps of batch 4 at lr 0.05, and every client's start weights (the model's own)."""
    from graphfed.client.contract import ClientRule, ClientSetting, LocalTraining
    from graphfed.core.params import ParamSpec
    from graphfed.models import build_model

    fed, split = model_client_data(name, counts, seed=1)
    torch.manual_seed(0)
    model = build_model(name, fed, {})
    spec = ParamSpec.from_module(model)
    rule = ClientRule(ClientSetting(spec, model.head_names, fed.task, fed.output_dim, LocalTraining(3, 4, 0.05)))
    start = spec.flatten_module(model).unsqueeze(0).repeat(len(counts), 1)
    return model, spec, split, rule, start


@contextlib.contextmanager
def registered_dataset(name: str, build: Callable[..., Any], task: str) -> Iterator[None]:
    """``dataset.name: <name>`` for the block only: the registry is process-wide and the catalogue test reads it."""
    from graphfed.data import DATASETS, register_dataset

    register_dataset(name, build, task=task, replace=True)  # type: ignore[arg-type]
    try:
        yield
    finally:
        DATASETS.pop(name, None)


class LoopbackHandler(http.server.BaseHTTPRequestHandler):
    """A publisher on 127.0.0.1 for the fetch tests: serves ``files`` (path -> bytes), honours range requests."""

    files: ClassVar[dict[str, bytes]] = {}
    ranges_seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        requested = self.headers.get("Range")
        if requested:
            self.ranges_seen.append(requested)
            start = int(requested.removeprefix("bytes=").split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            body = body[start:]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    LoopbackHandler.files, LoopbackHandler.ranges_seen = {}, []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), LoopbackHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def tar_gz(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    """A .tar.gz in memory of ``members`` (name -> bytes) and symbolic ``links`` (name -> target), as a download
    or a source distribution arrives."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buffer.getvalue()
