"""Device placement (``train.device``): what a CPU-only machine can check.

Runtime code creates every tensor on a named device (the data's or weights', or the host for bookkeeping).
``HostDeviceAudit`` tells host tensors (client ids, masks, counts) from the run's (data, weights, server state) on
the CPU and fails an operation that mixes them, where a GPU would have failed. Every registered method (built, two
rounds, an evaluation, novel-client adaptation) and every registered model (the training, evaluation and feedback
kernels) runs under it. It found, before any GPU run did, every method that the first GPU run of
``benchmarks/gpu.py`` saw fail.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from typer.testing import CliRunner

from conftest import model_client_data
from golden_runs import config_of
from graphfed.cli import app
from graphfed.client.contract import ClientRule, ClientSetting, LocalTraining
from graphfed.client.device_audit import DeviceMixError, HostDeviceAudit
from graphfed.client.evaluation import evaluate_clients
from graphfed.client.placement import HostRandomDraws, autocast, resolve_device, use_tensor_cores
from graphfed.client.training import train_clients, validation_feedback
from graphfed.config import ConfigError, RunConfig, load_config, validate_config
from graphfed.core.params import ParamSpec
from graphfed.methods import METHODS
from graphfed.methods.fedavg import FedAvg
from graphfed.models import MODELS, build_model
from graphfed.sim.checkpoint import load_checkpoint
from graphfed.sim.engine import Simulator, run_config

COUNTS = (30, 9, 0)  # a client without rows too


def _rounds_under_audit(method: str, client_data: str = "auto") -> tuple[dict[str, Any], Any]:
    config = config_of(method)
    config["train"] = {**config.get("train", {}), "client_data": client_data}
    with HostDeviceAudit():
        simulator = Simulator(validate_config(config), progress=False)
        simulator.run_round(0)
        simulator.run_round(1)
        return simulator.evaluate(1), simulator.evaluate_novel_adapted()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_creates_its_tensors_on_a_named_device(method: str) -> None:
    """... and runs, to the same numbers, with the clients' rows left in host memory (``train.client_data: host``,
    data larger than the GPU): under the audit those rows are host tensors, so any read that bypasses
    ``ClientSplit.read`` (a host row indexed by run-device indices) fails here as it would on a GPU."""
    on_device = _rounds_under_audit(method)
    on_host = _rounds_under_audit(method, "host")
    assert on_host == on_device


def test_the_audit_catches_a_tensor_made_without_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server step that makes a tensor without naming its device (here FedAvg adding zeros(dim) to its update)
    fails under the audit, naming the operation and the shapes: on a GPU the zeros would be on the CPU."""
    update = FedAvg.update

    def careless(self: FedAvg, client_ids: torch.Tensor, sent: torch.Tensor, delta: torch.Tensor,
                 metrics: dict[str, torch.Tensor]) -> None:
        update(self, client_ids, sent, delta + torch.zeros(delta.shape[1]), metrics)

    monkeypatch.setattr(FedAvg, "update", careless)
    with pytest.raises(DeviceMixError, match=r"add: mixes host \(CPU\) tensor\(s\) \(1482,\) with run-device"):
        _rounds_under_audit("fedavg")


def test_the_audit_catches_host_masks_and_indices_meeting_run_tensors() -> None:
    """The mixes the first GPU run met: a mask made from host client ids in ``torch.where`` over run tensors, a host
    tensor indexed by a run mask, and a random draw on the run's device (different numbers on a GPU). Indexing run
    tensors by host ids, 0-dim host scalars and host-only arithmetic stay allowed, as on a GPU."""
    device = torch.device("cpu")  # what resolve_device gives a CPU run: the run's device
    with HostDeviceAudit():
        weights = torch.ones(3, 4, device=device)
        client_ids = torch.arange(3, device="cpu")
        fresh = client_ids == 1  # host
        with pytest.raises(DeviceMixError, match="where: mixes host"):
            torch.where(fresh.view(-1, 1), weights, 2 * weights)
        assert torch.where(fresh.to(device).view(-1, 1), weights, 2 * weights)[1, 0] == 1
        with pytest.raises(DeviceMixError, match="host \\(CPU\\) tensor \\(3,\\) indexed by"):
            client_ids[weights.sum(1) > 0]
        assert weights[client_ids[:2]].shape == (2, 4)  # run tensor, host indices: fine on a GPU too
        assert float(weights.sum() * torch.tensor(2.0)) == 24.0  # a 0-dim host scalar
        with pytest.raises(DeviceMixError, match="random draw on the run's device"):
            torch.randn(3, device=device)
        with pytest.raises(DeviceMixError, match="numpy"):
            weights.numpy()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_trains_and_scores_on_a_named_device(name: str) -> None:
    fed, split = model_client_data(name, COUNTS)
    torch.manual_seed(0)
    model = build_model(name, fed, {})  # type: ignore[arg-type]
    spec = ParamSpec.from_module(model)
    start = spec.flatten_module(model).unsqueeze(0).repeat(len(COUNTS), 1)
    training = LocalTraining(2, 4, 0.05, "val_loss_pair")
    rule = ClientRule(ClientSetting(spec, model.head_names, fed.task, fed.output_dim, training), prox_mu=0.1)
    with HostDeviceAudit():
        trained = train_clients(model, spec, start, split, rule, [1, 2, 3]).trained
        scores = evaluate_clients(model, spec, trained, split, fed.task)
        feedback = validation_feedback(model, spec, trained, split, fed.task, training, [4, 5, 6])
        streamed = split.to(torch.device("cpu"), rows_on_host=True)  # the rows stay host tensors
        assert streamed.rows_on_host
        with pytest.raises(DeviceMixError, match="indexed by"):  # a read around ClientSplit.read is caught
            streamed.x[streamed.row_owners()[1]]
        assert torch.equal(train_clients(model, spec, start, streamed, rule, [1, 2, 3]).trained, trained)
        assert torch.equal(evaluate_clients(model, spec, trained, streamed, fed.task).metric, scores.metric)
        assert torch.equal(validation_feedback(model, spec, trained, streamed, fed.task, training, [4, 5, 6]),
                           feedback)
    assert trained.shape == start.shape and scores.metric.shape == (3,) and feedback.shape == (3, 2)


def test_train_device_names_what_this_machine_lacks_in_one_line(tmp_path: object) -> None:
    """``train.device`` is checked when a run is set up: a device the machine lacks is a ConfigError naming what
    torch found (exit 2 from the CLI), never a silent fallback; ``cpu`` and ``auto`` run here."""
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"train.device: cuda asked for, but this torch .* finds no CUDA"):
            resolve_device("cuda")
        result = CliRunner().invoke(app, ["run", "configs/demo_fl60.yaml", "--set", "train.device=cuda:1",
                                          "--set", "train.rounds=1", "--out", str(tmp_path), "--no-progress"])
        assert result.exit_code == 2
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: train.device: cuda:1 asked for, but this torch")
    with pytest.raises(ConfigError, match=r"train\.device"):
        load_config(None, ["train.device=gpu"])


def test_a_run_records_its_device_and_a_checkpoint_loads_onto_another(tmp_path: object) -> None:
    """The result says where the run computed; a checkpoint loads onto the device it is asked for (here the meta
    device stands in for a GPU: every tensor of the state comes back there)."""
    from pathlib import Path

    out = Path(str(tmp_path))
    config = load_config(None, ["dataset.name=fln", "dataset.num_clients=6", "model.options={hidden: 8}",
                                "train.rounds=2", "train.eval_every=2", "train.checkpoint_every=2",
                                "train.local_steps=2", "method.name=pfedhn", "train.device=cpu"])
    result = run_config(config, out, progress=False)
    assert result.device == "cpu"
    state = load_checkpoint(out, "meta")

    def devices(value: object) -> set[str]:
        if isinstance(value, torch.Tensor):
            return {value.device.type}
        if isinstance(value, dict):
            return set().union(*(devices(item) for item in value.values())) if value else set()
        if isinstance(value, list | tuple):
            return set().union(*(devices(item) for item in value)) if value else set()
        return set()

    assert devices(state) == {"meta"}


FLN = ["dataset.name=fln", "dataset.num_clients=8", "model.options={hidden: 16}", "method.name=fedavg",
       "train.rounds=15", "train.clients_per_round=8", "train.local_steps=10", "train.eval_every=5", "train.lr=0.1",
       "torch_threads=1"]


def test_bf16_autocast_trains_and_scores_close_to_fp32() -> None:
    """``train.precision: bf16`` runs the clients' forward and backward under autocast: the same run learns as well
    (within 3 points) yet is not the fp32 run (the matmuls really ran in bf16); fp32 stays the default."""
    fp32 = run_config(load_config(None, FLN), progress=False)
    bf16 = run_config(load_config(None, [*FLN, "train.precision=bf16"]), progress=False)
    assert load_config(None, FLN).train.precision == "fp32"
    assert fp32.test_mean > 0.65 and abs(bf16.test_mean - fp32.test_mean) < 0.03  # chance: 0.5
    assert bf16.val_mean != fp32.val_mean or bf16.test_std != fp32.test_std


def test_bf16_scores_match_fp32_scores_within_bf16_rounding() -> None:
    fed, split = model_client_data("mlp", COUNTS)
    torch.manual_seed(0)
    model = build_model("mlp", fed, {})  # type: ignore[arg-type]
    spec = ParamSpec.from_module(model)
    weights = spec.flatten_module(model).unsqueeze(0).repeat(len(COUNTS), 1)
    fp32 = evaluate_clients(model, spec, weights, split, fed.task)
    bf16 = evaluate_clients(model, spec, weights, split, fed.task, precision="bf16")
    assert fp32.loss.dtype == bf16.loss.dtype == torch.float32
    torch.testing.assert_close(bf16.loss, fp32.loss, rtol=2e-2, atol=2e-2)
    assert not torch.equal(bf16.loss, fp32.loss)


def test_precision_decides_whether_cuda_may_use_tf32_and_tf32_changes_nothing_on_a_cpu() -> None:
    """torch lets cuDNN convolutions round to TF32 unless told otherwise, which moved a GPU run's first round 4e-3
    from the CPU's: a run sets both TF32 switches from ``train.precision`` (fp32 and bf16: off; tf32: on). On a CPU
    tf32 is fp32: the same numbers, and no bf16 autocast."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True  # torch's default
        plain = run_config(load_config(None, [*FLN, "train.rounds=5"]), progress=False)
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (False, False)
        tf32 = run_config(load_config(None, [*FLN, "train.rounds=5", "train.precision=tf32"]), progress=False)
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)
        assert (tf32.test_mean, tf32.val_mean, tf32.test_std) == (plain.test_mean, plain.val_mean, plain.test_std)
        use_tensor_cores("bf16")
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        assert isinstance(autocast("tf32", torch.device("cpu")), nullcontext)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


class ConvolutionCalls(TorchDispatchMode):
    """Counts the convolutions a forward runs: one per layer when clients are batched, one per layer and client
    when they loop."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        self.count += func.overloadpacket == torch.ops.aten.convolution
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["pfl-cnn", "cnn-bn"])
def test_models_that_loop_over_clients_on_a_cpu_batch_them_on_other_devices(name: str) -> None:
    """pfl-cnn's convolutions and cnn-bn loop over clients where that is fastest (a CPU) and batch them elsewhere
    (a GPU's per-client loop is launch-bound: 10x slower in benchmarks/gpu.py). The meta device stands in for the
    GPU; cnn-bn's evaluation (no autograd) keeps its loop everywhere, for its memory."""
    fed, _ = model_client_data(name, COUNTS)
    model = build_model(name, fed, {})  # type: ignore[arg-type]
    spec = ParamSpec.from_module(model)
    start = spec.flatten_module(model).unsqueeze(0).repeat(4, 1)
    x = torch.rand(4, 5, *fed.input_shape)
    calls = {}
    for device in ("cpu", "meta"):
        with ConvolutionCalls() as counted:
            outputs = model.batched_forward(spec.unflatten(start.to(device)), x.to(device))
        assert outputs.shape == (4, 5, fed.output_dim) and outputs.device.type == device
        calls[device] = counted.count
    assert calls == {"cpu": 2 * 4, "meta": 2}  # two convolutional layers, four clients
    if name == "cnn-bn":
        with torch.no_grad(), ConvolutionCalls() as counted:
            model.batched_forward(spec.unflatten(start.to("meta")), x.to("meta"))
        assert counted.count == 2 * 4


def test_deterministic_algorithms_hold_for_the_run_only() -> None:
    """``train.deterministic`` turns torch's deterministic algorithms on while the run runs (CPU numbers are the
    same either way) and restores the setting after."""
    plain = run_config(load_config(None, [*FLN, "train.rounds=5"]), progress=False)
    strict = run_config(load_config(None, [*FLN, "train.rounds=5", "train.deterministic=true"]), progress=False)
    assert strict.test_mean == plain.test_mean and strict.val_mean == plain.val_mean
    assert not torch.are_deterministic_algorithms_enabled()


def test_a_flower_node_trains_on_the_device_its_node_config_names(make_config: Callable[..., RunConfig]) -> None:
    """A SuperNode's ``device`` node config wins over the run config's ``train.device`` (each machine of a deployment
    names its own accelerator); a device the node lacks, or a value that is not a name, is a one-line ConfigError."""
    from flwr.app import Context, RecordDict

    from graphfed.config import dump_config
    from graphfed.flower import client as flower_client
    from graphfed.flower import protocol

    run_config = {protocol.RUN_CONFIG_KEY: dump_config(make_config("fedavg", "train.device=auto"))}

    def node(**node_config: object) -> Context:
        return Context(run_id=1, node_id=7, node_config={"partition-id": 2, "num-partitions": 12, **node_config},
                       state=RecordDict(), run_config=dict(run_config))

    client_id, side = flower_client.node_client(node(device="cpu"))
    assert client_id == 2 and side.device == torch.device("cpu") and side.federation.train.x.device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"train.device: cuda:3 asked for, but this torch .* finds no CUDA"):
            flower_client.node_client(node(device="cuda:3"))
    with pytest.raises(ConfigError, match=r"node config device=4: give a device name"):
        flower_client.node_client(node(device=4))


def test_flower_app_prints_the_simulation_resources_of_the_config(tmp_path: Path) -> None:
    """``flower.client_cpus`` / ``flower.client_gpus`` (GPU fractions allowed) reach the printed `flwr run`
    command that starts Flower's simulation engine."""
    result = CliRunner().invoke(app, ["flower-app", "configs/demo_fl60.yaml", "--out", str(tmp_path / "app"),
                                      "--set", "flower.client_gpus=0.25", "--set", "flower.client_cpus=2"])
    assert result.exit_code == 0, result.output
    assert "client-resources-num-cpus=2 client-resources-num-gpus=0.25" in " ".join(result.output.split())


def test_host_random_draws_give_a_module_built_on_the_run_device_the_cpus_numbers() -> None:
    """``nn.Linear`` / ``nn.Embedding`` built on the run's device draw their initial values through ``nn.init``,
    whose nested ``uniform_`` a mode never sees: the audit refuses that draw (on a GPU it would use CUDA's
    generator, and the first GPU run's hypernetworks started from other numbers than the CPU's), and under
    ``HostRandomDraws`` the module gets exactly the numbers a CPU build draws from the same seed."""
    torch.manual_seed(7)
    reference = [torch.nn.Linear(5, 3), torch.nn.Embedding(4, 2)]
    with HostDeviceAudit(), torch.device(torch.device("cpu")):  # the run's device, as resolve_device gives it
        with pytest.raises(DeviceMixError, match="kaiming_uniform_: a random draw on the run's device"):
            torch.nn.Linear(5, 3)
        torch.manual_seed(7)
        with HostRandomDraws():
            built = [torch.nn.Linear(5, 3), torch.nn.Embedding(4, 2)]
    for ours, theirs in zip(built, reference, strict=True):
        for mine, expected in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert torch.equal(mine, expected)


def test_train_client_data_decides_where_the_rows_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an accelerator ``auto`` moves the rows onto it when they fit in 80 % of its free memory and leaves them
    in host memory otherwise; ``device`` refuses a federation that does not fit, in one line naming the option
    that streams it; ``host`` always streams. (A stand-in device: the question is only how much memory it has.)"""
    from graphfed.core import memory
    from graphfed.data import build_federation
    from graphfed.setup import clients_rows_on_host

    config = validate_config(config_of("fedavg"))
    federation = build_federation(config.dataset, config.seed)
    rows = sum(split.x.nbytes + split.y.nbytes for split in (federation.train, federation.val, federation.test))
    gpu = torch.device("cuda")

    def decide(client_data: str, free_bytes: int) -> bool:
        monkeypatch.setattr(memory, "available_memory_bytes", lambda device=None: free_bytes)
        return clients_rows_on_host(config.model_copy(update={"train": config.train.model_copy(
            update={"client_data": client_data})}), federation, gpu)

    assert decide("auto", 2 * rows) is False and decide("auto", rows) is True
    assert decide("host", 10 * rows) is True and decide("device", 2 * rows) is False
    with pytest.raises(ConfigError, match=r"the federation's rows on cuda needs .* set train.client_data=host"):
        decide("device", rows)
    assert clients_rows_on_host(config, federation, torch.device("cpu")) is False  # the CPU's rows are the host's
    with pytest.raises(ConfigError, match="client_data"):
        load_config(None, ["train.client_data=disk"])
