"""FLHA-GHN and heterogeneous client architectures: the GHN, the grouped engine, the baselines, Flower parity."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import ModuleType

import pytest
import torch

from conftest import read_rounds, without_wall_time
from graphfed.config import ConfigError, RunConfig, dump_config, load_config
from graphfed.core.params import ParamSpec
from graphfed.data.federation import ClientSplit, Federation
from graphfed.methods.flha_ghn import FlhaGhn
from graphfed.models.resnet_like import ARCHITECTURES, ResNetLike
from graphfed.nn.ghn import GeneratedNetwork, GraphHypernetwork, plan_architecture, vocabulary
from graphfed.sim.checkpoint import load_checkpoint
from graphfed.sim.engine import Simulator, run_config
from test_engine import interrupt_at

IMAGE = (3, 8, 8)
CLASSES = 4


def image_federation(num_clients: int = 4, rows: int = 48, seed: int = 0) -> Federation:
    """Tiny images whose class is the brightest of 4 colour patterns (learnable by a 2-channel CNN in seconds)."""
    generator = torch.Generator().manual_seed(seed)
    patterns = torch.randn(CLASSES, *IMAGE, generator=generator)

    def split(count: int) -> ClientSplit:
        xs, ys = [], []
        for _ in range(num_clients):
            y = torch.randint(CLASSES, (count,), generator=generator)
            xs.append(patterns[y] + 0.8 * torch.randn(count, *IMAGE, generator=generator))
            ys.append(y)
        return ClientSplit.from_lists(xs, ys, "classification")

    return Federation("patterns", "classification", split(rows), split(rows // 4), split(rows // 2), IMAGE, CLASSES)


def mixed_config(method: str, *overrides: str, architectures: str = "[small, arch1]") -> RunConfig:
    return load_config(None, ["dataset.name=digits", "model.name=resnet-like", "model.options={width: 2}",
                              f"model.architectures={architectures}", f"method.name={method}", "train.rounds=4",
                              "train.clients_per_round=4", "train.local_steps=6", "train.batch_size=16",
                              "train.lr=0.05", "train.eval_every=2", "train.checkpoint_every=2",
                              "train.novel_adapt_rounds=0", *overrides])


def family_types(width: int = 8) -> tuple[list[ResNetLike], GraphHypernetwork]:
    models = [ResNetLike((3, 32, 32), 10, arch, width) for arch in ARCHITECTURES]
    return models, GraphHypernetwork(vocabulary(models))


# ---- the graph hypernetwork ---------------------------------------------------------------------------


def test_generated_weights_fit_every_architecture_with_kaiming_statistics() -> None:
    """For every member of the family the GHN emits exactly the architecture's parameter shapes; at initialisation
    conv/linear weights have mean 0 and variance 2 / fan_in (the ratio of empirical to Kaiming variance, averaged
    over 5 seeds, within 15 % for each architecture), BatchNorm gains are 1 and shifts/biases 0."""
    models, _ = family_types()
    for model in models:
        ratios, means = [], []
        for seed in range(5):
            torch.manual_seed(seed)
            ghn = GraphHypernetwork(vocabulary(models))
            with torch.no_grad():
                weights = ghn(plan_architecture(model, ghn.types))
            assert {name: tuple(v.shape) for name, v in weights.items()} == \
                {name: tuple(p.shape) for name, p in model.named_parameters()}
            for name, value in weights.items():
                if value.ndim >= 2:
                    fan_in = math.prod(value.shape[1:])
                    ratios.append(float(value.var()) / (2.0 / fan_in))
                    means.append(float(value.mean()) * math.sqrt(fan_in / 2.0))
                elif name.endswith("weight"):
                    assert torch.equal(value, torch.ones_like(value)), name
                else:
                    assert torch.equal(value, torch.zeros_like(value)), name
        assert abs(sum(ratios) / len(ratios) - 1.0) < 0.15, (model.arch, sum(ratios) / len(ratios))
        assert abs(sum(means) / len(means)) < 0.1, model.arch


def test_architecture_graph_layer_types_and_unknown_types() -> None:
    """Layers of the same kind, stride and shapes share a head; an architecture with a layer type outside the
    vocabulary is refused with a message naming the layer."""
    models, ghn = family_types()
    plan = plan_architecture(models[0], ghn.types)
    repeated = max(len(rows) for rows, _ in plan.nodes_by_type.values())
    assert repeated >= 4  # arch0 repeats its 3x3 8->8 convolutions and their BatchNorms
    wider = ResNetLike((3, 32, 32), 10, "arch0", width=16)
    with pytest.raises(ValueError, match="no head for"):
        plan_architecture(wider, ghn.types)


def test_the_ghn_trains_end_to_end_through_the_architecture() -> None:
    """The loss of a generated network reaches every GNN layer and the heads of the layer types it uses, and not
    the heads of types it lacks (their gradient is zero, not an error)."""
    _, ghn = family_types(width=2)
    small = ResNetLike((3, 32, 32), 10, "small", width=2)
    network = GeneratedNetwork(ghn, small)
    spec = ParamSpec.from_module(network)
    params = {k: v.requires_grad_(True) for k, v in spec.unflatten(spec.flatten_module(network).unsqueeze(0)).items()}
    out = network.batched_forward(params, torch.randn(1, 8, 3, 32, 32))
    grads = dict(zip(params, torch.autograd.grad(out.pow(2).mean(), list(params.values()), allow_unused=True),
                     strict=True))
    used = set(plan_architecture(small, ghn.types).nodes_by_type)
    for name, grad in grads.items():
        if name.startswith("ghn.gnn.") and name.endswith("lin_rel.weight"):
            assert grad is not None and grad.abs().sum() > 0, name
        if name.startswith("ghn.heads.") and name.endswith("out.weight"):
            head = int(name.split(".")[2])
            assert (grad is not None and grad.abs().sum() > 0) == (head in used), name


# ---- the method ----------------------------------------------------------------------------------------


def test_fedavg_of_ghn_weights_is_exactly_the_mean() -> None:
    """Algorithm 1: the server's new GHN is the plain mean of the clients' trained GHNs."""
    simulator = Simulator(mixed_config("flha-ghn"), federation=image_federation(), progress=False)
    method = simulator.setup.method
    assert isinstance(method, FlhaGhn)
    ids = torch.arange(4)
    sent = method.personalize(ids)
    trained = sent + torch.randn(sent.shape, generator=torch.Generator().manual_seed(0))
    method.update(ids, sent, sent - trained, {"num_examples": torch.tensor([1.0, 2.0, 3.0, 50.0])})
    assert torch.allclose(method.global_weights, trained.mean(0), atol=1e-6)


def test_identity_gnn_with_linear_heads_is_fedavg() -> None:
    """The paper's remark: with the GNN as identity and linear heads, FLHA-GHN is FedAvg. On one architecture
    whose layers each have their own type (``small``), both runs start from the same generated network and after
    3 rounds generate/hold the same weights."""
    federation = image_federation()
    ghn_config = mixed_config("flha-ghn", "method.options={gnn_layers: 0, heads: linear, refine_epochs: 0}",
                              "train.rounds=3", architectures="[small]")
    flha = Simulator(ghn_config, federation=federation, progress=False)
    network = flha.setup.clients.networks[0]
    assert isinstance(network, GeneratedNetwork)
    arch_spec = ParamSpec.from_module(network.architecture)

    def generated() -> torch.Tensor:
        weights = flha.setup.method.eval_weights(torch.arange(1))
        return arch_spec.flatten(network.generate(flha.setup.spec.unflatten(weights)), batch_dims=1)[0].detach()

    fedavg = Simulator(load_config(None, ["dataset.name=digits", "model.name=resnet-like",
                                          "model.options={width: 2, arch: small}", "method.name=fedavg",
                                          "train.rounds=3", "train.clients_per_round=4", "train.local_steps=6",
                                          "train.batch_size=16", "train.lr=0.05"]),
                       federation=federation, progress=False)
    fedavg.setup.method.global_weights = generated().clone()
    for round_index in range(3):
        flha.run_round(round_index)
        fedavg.run_round(round_index)
    assert torch.allclose(generated(), fedavg.setup.method.global_weights, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(generated(), ParamSpec.from_module(network.architecture).flatten_module(
        network.architecture), atol=1e-3)  # it did train


def test_flha_ghn_learns_on_mixed_architectures_and_refines_the_head() -> None:
    """Two architectures train one GHN: both groups' accuracy rises well above chance (25 %); the head
    refinement changes only the head of the generated weights."""
    federation = image_federation(rows=96)
    summary = run_config(mixed_config("flha-ghn", "train.rounds=10", "train.eval_every=10"), federation=federation,
                         progress=False)
    assert summary.test_mean > 0.6, summary.test_mean
    simulator = Simulator(mixed_config("flha-ghn", "train.rounds=1"), federation=federation, progress=False)
    simulator.run_round(0)
    runtime = simulator.executor.runtime_of(1)  # type: ignore[attr-defined]
    network = runtime.model
    ids = torch.tensor([1, 3])
    received = simulator.setup.method.eval_weights(ids)
    rule = runtime.rule
    plain = rule.evaluation_network(network, received, federation.train.select(ids), torch.tensor([False, False]),
                                    [1, 2])
    refined = rule.evaluation_network(network, received, federation.train.select(ids), torch.tensor([True, True]),
                                      [1, 2])
    assert plain is not None and refined is not None
    spec = plain[1]
    changed = {t.name for t in spec.tensors if not torch.equal(plain[2][:, t.slice], refined[2][:, t.slice])}
    assert changed == set(network.architecture.head_names)


def test_mixed_architecture_run_resumes_bit_identically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted in round 3 of 4 (checkpoint after round 2) and resumed: the same summary and rounds as an
    uninterrupted run, for the GHN and for a baseline with per-architecture state (Local's padded weights)."""
    federation = image_federation()
    for method in ("flha-ghn", "local"):
        config = mixed_config(method)
        clean = run_config(config, tmp_path / f"{method}-clean", progress=False, federation=federation)
        out = tmp_path / f"{method}-resumed"
        interrupt_at(monkeypatch, 2)
        with pytest.raises(KeyboardInterrupt):
            run_config(config, out, progress=False, federation=federation)
        assert load_checkpoint(out)["completed_rounds"] == 2
        monkeypatch.undo()
        resumed = run_config(config, out, resume=True, progress=False, federation=federation)
        assert without_wall_time(resumed) == without_wall_time(clean), method
        assert [r["round"] for r in read_rounds(out)] == [2, 4]


# ---- baselines -----------------------------------------------------------------------------------------


def test_local_keeps_each_client_on_its_own_architecture() -> None:
    """The ``own`` wire: each client's row is its architecture's parameters, zero past them; training never writes
    past them; the wire counts each architecture's own size (Local itself sends nothing: it is billed 0)."""
    federation = image_federation()
    simulator = Simulator(mixed_config("local", "train.rounds=1"), federation=federation, progress=False)
    family = simulator.setup.family
    assert family is not None and family.names == ("small", "arch1")
    dims = [spec.dim for spec in family.specs]
    simulator.run_round(0)
    weights = simulator.setup.method.eval_weights(torch.arange(4))
    for client in range(4):
        arch = int(family.assignment[client])
        assert arch == client % 2  # round-robin
        assert torch.equal(weights[client, dims[arch]:], torch.zeros(family.max_dim - dims[arch]))
        assert not torch.equal(weights[client, :dims[arch]], family.init_weights[arch])
    assert simulator.setup.wire_values(torch.arange(4)) == 2 * (dims[0] + dims[1])
    assert simulator.tracker.bytes_up == simulator.tracker.bytes_down == 0


def test_pfedhn_generates_per_architecture_heads() -> None:
    """pFedHN's variant: a shared trunk and one head set per architecture; each client gets its architecture's
    number of weights (zero-padded), and a round moves the hypernetwork."""
    simulator = Simulator(mixed_config("pfedhn", "train.rounds=1", "method.options={hidden: 8}"),
                          federation=image_federation(), progress=False)
    family = simulator.setup.family
    assert family is not None
    weights = simulator.setup.method.personalize(torch.arange(4)).detach()
    for client in range(4):
        arch = int(family.assignment[client])
        dim = family.specs[arch].dim
        assert weights[client, :dim].abs().sum() > 0
        assert torch.equal(weights[client, dim:], torch.zeros(family.max_dim - dim))
        # the heads start from the architecture's initialisation: BatchNorm gains near 1, not near 0
        gains = torch.cat([weights[client, t.slice] for t in family.specs[arch].tensors
                           if t.name.endswith("weight") and len(t.shape) == 1])
        assert 0.5 < float(gains.mean()) < 1.5
    simulator.run_round(0)
    assert not torch.equal(simulator.setup.method.personalize(torch.arange(4)).detach(), weights)


def test_flha_distillation_student_follows_the_teacher() -> None:
    """alpha = 1 (distillation only): after distillation the student agrees with the teacher's predictions on most
    training rows, far more than the untrained student does."""
    federation = image_federation(rows=96)
    config = mixed_config("flha-distill", "train.rounds=4",
                          "method.options={teacher: small, alpha: 1.0, temperature: 2.0, distill_steps: 60}",
                          architectures="[arch1]")
    simulator = Simulator(config, federation=federation, progress=False)
    for round_index in range(4):
        simulator.run_round(round_index)
    runtime = simulator.executor.runtime_of(0)  # type: ignore[attr-defined]
    ids = torch.arange(4)
    teacher = simulator.setup.method.eval_weights(ids)
    train = federation.train.select(ids)
    everyone = torch.ones(4, dtype=torch.bool)
    student, spec, distilled = runtime.rule.evaluation_network(runtime.model, teacher, train, everyone, [0, 1, 2, 3])
    x = train.padded().x[:, :64]
    with torch.no_grad():
        taught = runtime.model.batched_forward(simulator.setup.spec.unflatten(teacher), x).argmax(-1)
        before = student.batched_forward(spec.unflatten(spec.flatten_module(student).expand(4, -1)), x).argmax(-1)
        after = student.batched_forward(spec.unflatten(distilled), x).argmax(-1)
    assert (after == taught).float().mean() > 0.8
    assert (after == taught).float().mean() > (before == taught).float().mean() + 0.3


# ---- configuration --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "message"), [
    (["method.name=fedavg"], "with model.architectures use local, pfedhn, flha-ghn, flha-distill"),
    (["model.architectures=[arch0, arch9]"], "unknown architecture"),
    (["model.options={arch: arch0}"], "either it (one architecture) or model.architectures"),
    (["model.architecture_of=[small, arch3]"], "model.architectures does not list"),
])
def test_mixed_architecture_configs_are_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, ["dataset.name=digits", "model.name=resnet-like", "model.architectures=[small, arch1]",
                           "method.name=flha-ghn", *overrides])


def test_a_ghn_method_needs_architectures_and_a_model_family() -> None:
    with pytest.raises(ConfigError, match=r"set model\.architectures"):
        load_config(None, ["dataset.name=digits", "method.name=flha-ghn"])
    with pytest.raises(ConfigError, match="has one architecture"):
        load_config(None, ["dataset.name=digits", "model.name=mlp", "model.architectures=[a, b]",
                           "method.name=local"])


def test_architecture_of_assigns_clients_explicitly() -> None:
    config = mixed_config("local", "model.architecture_of=[arch1, arch1, small, arch1]", "train.rounds=1")
    simulator = Simulator(config, federation=image_federation(), progress=False)
    assert simulator.setup.family is not None
    assert simulator.setup.family.assignment.tolist() == [1, 1, 0, 1]
    with pytest.raises(ConfigError, match="3 entries for 4 clients"):
        Simulator(mixed_config("local", "model.architecture_of=[arch1, arch1, small]"),
                  federation=image_federation(), progress=False)


def test_client_fraction_gives_each_client_that_share_of_the_rows() -> None:
    """FLHA-GHN's 'local data %': 4 clients x 12.5 % of digits' 1,797 rows keep about 225 rows each, for IID and
    label-skewed partitions; asking for more than all rows, or a dataset with its own clients, is refused."""
    from graphfed.config import DatasetConfig
    from graphfed.data import build_federation

    for partition in ("iid", "dirichlet"):
        federation = build_federation(DatasetConfig(name="digits", num_clients=4, partition=partition,
                                                    client_fraction=0.125), 0)
        rows = federation.train.counts + federation.val.counts + federation.test.counts
        assert abs(int(rows.sum()) - 0.5 * 1797) <= 4
        if partition == "iid":
            assert (rows - 1797 * 0.125).abs().max() <= 2
    with pytest.raises(ConfigError, match=r"at most 0\.25"):
        build_federation(DatasetConfig(name="digits", num_clients=4, client_fraction=0.3), 0)
    with pytest.raises(ConfigError, match="has its own clients"):
        build_federation(DatasetConfig(name="fl60", client_fraction=0.01), 0)


# ---- Flower -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["flha-ghn", "local", "flha-distill"])
def test_flower_nodes_build_their_own_architecture_and_match_the_simulator(method: str) -> None:
    """On the in-process Flower grid each node builds its architecture from the run config and its partition id:
    the summary equals the simulator's exactly."""
    from graphfed.flower import protocol
    from graphfed.flower.app import client_app, run_on_grid
    from graphfed.flower.inprocess import InProcessGrid
    from graphfed.flower.server import FLOWER_FIELDS

    options = {"flha-distill": ["method.options={teacher: small, distill_steps: 5}"],
               "flha-ghn": ["method.options={refine_epochs: 0.5}"]}.get(method, [])
    config = load_config(None, ["dataset.name=cifar10", "dataset.num_clients=4", "dataset.partition=iid",
                                "dataset.client_fraction=0.004", "model.name=resnet-like", "model.options={width: 2}",
                                "model.architectures=[small, arch1]", f"method.name={method}", *options,
                                "train.rounds=2", "train.eval_every=1", "train.clients_per_round=3",
                                "train.local_steps=3", "train.batch_size=8", "train.novel_adapt_rounds=0"])
    simulated = run_config(config, progress=False)
    grid = InProcessGrid(client_app, 4, {protocol.RUN_CONFIG_KEY: dump_config(config)}, seed=0)
    on_flower = run_on_grid(grid, config, None)
    assert on_flower.dropped_clients == []
    flower_summary = {k: v for k, v in without_wall_time(on_flower).items() if k not in FLOWER_FIELDS}
    assert flower_summary == without_wall_time(simulated)


def _flha_script() -> ModuleType:
    """``benchmarks/flha.py`` as a module."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import flha

    return flha


def test_the_flha_suite_holds_the_papers_experiments_at_three_seeds() -> None:
    """The ``flha`` suite: Table 1 at three data shares with the paper's five rows, and the cells the
    report reads, each at 3 seeds; the left-out architecture is the same client under every seed."""
    from graphfed.suites import load_suite, suite_cells

    flha = _flha_script()
    suite = load_suite(flha.SUITE)
    cells = suite_cells(suite)
    by_section: dict[str, set[str]] = {}
    for cell in cells:
        by_section.setdefault(cell.dataset, set()).add(cell.method)
    for share, fraction in (("6.25", 0.0625), ("12.5", 0.125), ("25", 0.25)):
        assert by_section[f"t1-{share}"] == set(flha.TABLE1)
        assert {c.config.dataset.client_fraction for c in cells if c.dataset == f"t1-{share}"} == {fraction}
    assert {c.config.seed for c in cells} == {0, 1, 2} and len(cells) == 3 * sum(map(len, by_section.values()))
    upper = next(c.config for c in cells if c.method == "upper")
    assert upper.method.name == "fedavg" and upper.model.architectures is None and upper.model.options == {
        "arch": "arch0"}
    loo = [c.config for c in cells if c.dataset == "loo"]
    assert all(c.dataset.novel_clients == ["3"] and c.model.architectures[3] == "arch3" for c in loo)  # type: ignore[index]
    assert [c.config.model.architectures for c in cells if c.dataset == "t7" and c.config.seed == 0] == [
        ["small", "arch1", "arch2", "arch3"], ["arch0", "small", "arch2", "arch3"],
        ["arch0", "arch1", "small", "arch3"], ["arch0", "arch1", "arch2", "small"]]
    assert {claim.dataset for claim in suite.claims} <= set(by_section)


def test_refinement_curves_train_the_left_out_architecture_from_a_finished_run(tmp_path: Path) -> None:
    """``flha.py refine``'s curves come from a finished run directory (its config and final checkpoint): the novel
    client's own architecture, trained from the GHN's weights and from its initialisation on the same batches."""
    flha = _flha_script()
    config = load_config(None, ["dataset.name=cifar10", "dataset.num_clients=4", "dataset.partition=iid",
                                "dataset.client_fraction=0.004", "dataset.novel_clients=[3]", "model.name=resnet-like",
                                "model.options={width: 2}", "model.architectures=[small, arch1]",
                                "model.architecture_of=[small, small, small, arch1]", "method.name=flha-ghn",
                                "method.options={refine_epochs: 0.5}", "train.rounds=2", "train.eval_every=1",
                                "train.clients_per_round=3", "train.local_steps=3", "train.batch_size=8",
                                "train.novel_adapt_rounds=0"])
    run_config(config, tmp_path, progress=False)
    curves = flha.refinement_curves(tmp_path, steps=4, every=2)
    assert curves["architecture"] == "arch1" and curves["steps"] == [0, 2, 4]
    assert len(curves["ghn"]) == len(curves["scratch"]) == 3
    assert all(0.0 <= value <= 1.0 for value in (*curves["ghn"], *curves["scratch"]))
    assert curves["ghn"] != curves["scratch"]  # the GHN's weights are not the architecture's initialisation


def test_the_flha_report_is_regenerated_from_its_run_directories() -> None:
    """``benchmarks/results/flha/report.md`` is exactly what ``benchmarks/flha.py report`` writes from the committed
    ``runs/*/*/seed*/summary.json`` (no hand-edited number)."""
    flha = _flha_script()
    # stale marks are today's judgement of each run (engine behaviour, its own modules): a change that stales a run
    # must come with the report regenerated
    assert (flha.RESULTS / "report.md").read_text() == flha.render()


def test_table7_drop_compares_each_other_architecture_with_the_same_architecture_in_table1() -> None:
    """The paper's Table 7 statistic: when one architecture is replaced by `small`, how far each *other*
    architecture falls against itself in `t1-6.25` -- the replaced one never enters."""
    from graphfed.runs import RunResult

    flha = _flha_script()

    def run(**by_arch: float) -> RunResult:
        return RunResult(status="completed", seed=0, test_mean=0.4, test_by_architecture=by_arch)

    table1 = run(arch0=0.40, arch1=0.40, arch2=0.40, arch3=0.40)
    results = {("t1-6.25", "flha-ghn"): [table1]}
    for replaced in range(4):
        # the replaced architecture's slot holds a score the drop must ignore; the others fall by 1 or 3 points
        others = {arch: 0.39 if replaced % 2 else 0.37 for arch in flha.ARCHS if arch != f"arch{replaced}"}
        results[("t7", f"small{replaced}")] = [run(**others, **{f"arch{replaced}": 0.0}, small=0.30)]
    text = flha.small_arch_drop(flha.Runs(results))
    assert "drop by 2.0 ± 1.0 points" in text and "12 pairs" in text
    del results[("t7", "small1")], results[("t7", "small2")], results[("t7", "small3")]
    results[("t7", "small0")] = []
    assert "needs both sections run" in flha.small_arch_drop(flha.Runs(results))
