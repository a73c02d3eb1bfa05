"""Models of text: LEAF's LSTM and a small causal transformer whose LoRA adapters alone train and travel over a
frozen, shared base; a base pretrained on public plays; hypernetworks writing each role's own adapter."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from graphfed.config import ConfigError, load_config
from graphfed.core.params import ParamSpec
from graphfed.models import build_model
from graphfed.models.char_transformer import CharTransformer
from graphfed.sim.engine import Simulator

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
needs_texts = pytest.mark.skipif(not (SHARED / "shakespeare").is_dir(), reason="../shared/data/shakespeare is absent")
TEXT = SimpleNamespace(name="text", task="classification", input_shape=(80,), output_dim=80)
TINY = {"width": 16, "layers": 2, "heads": 2}
LORA = {**TINY, "adapter": {"kind": "lora", "rank": 2, "alpha": 4, "targets": ["qkv", "out", "up", "down", "head"]}}


def stacked(model: torch.nn.Module, clients: int) -> dict[str, torch.Tensor]:
    return {name: value.detach().unsqueeze(0).repeat(clients, *[1] * value.dim())
            for name, value in model.named_parameters()}


@pytest.mark.parametrize("options", [TINY, LORA], ids=["full", "lora"])
def test_a_clients_forward_is_its_row_of_the_batched_forward(options: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = build_model("char-transformer", TEXT, options)  # type: ignore[arg-type]
    params = stacked(model, 3)
    with torch.no_grad():
        for value in params.values():
            value.add_(0.05 * torch.randn_like(value))  # three different clients
        x = torch.randint(0, 80, (3, 5, 80)).float()
        batched = model.batched_forward(params, x)
        for client in range(3):
            one = {name: value[client:client + 1] for name, value in params.items()}
            torch.testing.assert_close(model.batched_forward(one, x[client:client + 1])[0], batched[client],
                                       rtol=1e-5, atol=1e-5)


def test_lora_adds_its_low_rank_term_to_a_frozen_base_and_starts_as_the_base() -> None:
    """W x + b + (alpha / r) B A x at every targeted layer; B starts at zero, so an adapter starts as the base."""
    torch.manual_seed(0)
    base = build_model("char-transformer", TEXT, TINY)  # type: ignore[arg-type]
    adapted = build_model("char-transformer", TEXT, LORA)  # type: ignore[arg-type]
    with torch.no_grad():
        for name, value in base.named_parameters():
            adapted.get_buffer(name).copy_(value)
    x = torch.randint(0, 80, (4, 80)).float()
    torch.testing.assert_close(adapted(x), base(x))
    layer = adapted.get_submodule("head")
    with torch.no_grad():
        layer.lora_B.normal_()
        h = torch.randn(1, 6, 16)
        expected = h @ layer.weight.T + layer.bias + 2.0 * (h @ layer.lora_A.T) @ layer.lora_B.T
        got = adapted._linear({name: value.unsqueeze(0) for name, value in adapted.named_parameters()}, "head", h)
    torch.testing.assert_close(got, expected)


def test_the_written_out_lora_backward_is_autograds_of_the_same_expression_to_second_order() -> None:
    """``LoraLinear`` (forward and a hand-written backward) against autograd on ``W h + b + s B A h``: first
    derivatives for the input and both factors, and second derivatives (Per-FedAvg's Hessian-vector products)."""
    from graphfed.models.char_transformer import LoraLinear

    torch.manual_seed(0)
    weight, bias = torch.randn(6, 5, dtype=torch.double), torch.randn(6, dtype=torch.double)
    inputs = (torch.randn(3, 7, 5, dtype=torch.double, requires_grad=True),
              torch.randn(3, 2, 5, dtype=torch.double, requires_grad=True),
              torch.randn(3, 6, 2, dtype=torch.double, requires_grad=True))

    def written(h: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor) -> torch.Tensor:
        return LoraLinear.apply(h, weight, bias, lora_a, lora_b, 1.5)

    def plain(h: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor) -> torch.Tensor:
        return F.linear(h, weight, bias) + 1.5 * h @ lora_a.transpose(1, 2) @ lora_b.transpose(1, 2)

    torch.testing.assert_close(written(*inputs), plain(*inputs))
    out_grad = torch.randn(3, 7, 6, dtype=torch.double)
    for first, expected in zip(torch.autograd.grad(written(*inputs), inputs, out_grad, create_graph=True),
                               torch.autograd.grad(plain(*inputs), inputs, out_grad, create_graph=True), strict=True):
        torch.testing.assert_close(first, expected)
    assert torch.autograd.gradgradcheck(written, inputs)


def test_a_next_character_prediction_computes_only_the_last_position_and_gets_the_full_networks_answer() -> None:
    """The last block computes the last position's query (keys and values of all): the same logits as the full
    network's last position, with adapters that are not zero."""
    torch.manual_seed(0)
    model = build_model("char-transformer", TEXT, LORA)  # type: ignore[arg-type]
    with torch.no_grad():
        for value in model.parameters():
            value.normal_(0, 0.3)
        x = torch.randint(0, 80, (3, 80)).float()
        torch.testing.assert_close(model(x), model.sequence_logits(x)[:, -1], rtol=1e-5, atol=1e-5)
        earlier = x.clone()
        earlier[:, 0] = (earlier[:, 0] + 1) % 80  # the last position reads the first (no causal mask cut it off)
        assert not torch.allclose(model(x), model(earlier))


def test_only_the_adapters_are_parameters_and_the_base_receives_no_gradient() -> None:
    model = build_model("char-transformer", TEXT, LORA)  # type: ignore[arg-type]
    assert isinstance(model, CharTransformer)
    names = ParamSpec.from_module(model).names
    assert names and all(name.endswith((".lora_A", ".lora_B")) for name in names)
    assert "blocks.0.qkv.weight" in model.base_names and "embed.weight" in model.base_names
    flat = ParamSpec.from_module(model).flatten_module(model).unsqueeze(0).requires_grad_(True)
    out = model.batched_forward(ParamSpec.from_module(model).unflatten(flat), torch.randint(0, 80, (1, 3, 80)).float())
    out.sum().backward()
    assert flat.grad is not None and all(not buffer.requires_grad for buffer in model.buffers())
    assert model.head_names == ("head.lora_A", "head.lora_B")


@pytest.mark.parametrize("adapter", [{"kind": "prefix"}, {"rank": 0}, {"targets": ["attn"]}, {"rank": 2, "beta": 1}])
def test_a_wrong_adapter_is_one_config_error(adapter: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"model\.options\.adapter"):
        build_model("char-transformer", TEXT, {**TINY, "adapter": adapter})  # type: ignore[arg-type]


def test_leaf_lstm_is_pytorchs_lstm() -> None:
    torch.manual_seed(0)
    model = build_model("leaf-lstm", TEXT, {"hidden": 12})  # type: ignore[arg-type]
    reference = torch.nn.LSTM(8, 12, 2, batch_first=True)
    with torch.no_grad():
        for layer in range(2):
            for part in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(reference, f"{part}_l{layer}").copy_(getattr(model.cells[layer], part))
        x = torch.randint(0, 80, (3, 80)).float()
        states, _ = reference(model.embed(x.long()))
        torch.testing.assert_close(model(x), model.head(states[:, -1]), rtol=1e-5, atol=1e-6)


def tiny_run(*overrides: str) -> Any:
    return load_config(None, ["dataset.name=shakespeare", "dataset.plays=[macbeth]", "dataset.num_clients=4",
                              "dataset.text_stride=60", "dataset.novel_fraction=0", "model.name=char-transformer",
                              f"model.options={LORA}".replace("'", ""), "method.name=fedavg", "train.rounds=2",
                              "train.local_steps=2", "train.batch_size=8", "train.clients_per_round=4",
                              "train.eval_every=2", "train.lr=0.5", *overrides])


@needs_texts
def test_the_adapters_train_and_travel_and_the_shared_base_stays_as_it_was() -> None:
    """A FedAvg round moves the global adapter; every byte on the wire is the adapter's; the base is unchanged."""
    simulator = Simulator(tiny_run(), progress=False)
    model, spec = simulator.setup.clients.model, simulator.setup.spec
    base = {name: buffer.clone() for name, buffer in model.named_buffers()}
    before = simulator.setup.method.global_weights.clone()
    result = simulator.run()
    assert not torch.equal(before, simulator.setup.method.global_weights)  # the adapters moved
    assert all(torch.equal(base[name], buffer) for name, buffer in model.named_buffers())
    assert result.num_params == spec.dim and result.bytes_up == 2 * 4 * spec.dim * 4  # 2 rounds x 4 clients


@needs_texts
def test_a_pretrained_base_is_what_every_client_starts_from_and_is_recorded(tmp_path: Path) -> None:
    from graphfed.models.pretrained import pretrain

    config = tiny_run()
    record = pretrain(config, tmp_path / "base.pt", steps=3, batch=4, stride=200, echo=lambda _: None)
    assert "macbeth" not in record["pretrained_on"] and "hamlet" in record["pretrained_on"]
    saved = torch.load(tmp_path / "base.pt", weights_only=True)
    simulator = Simulator(tiny_run(f"model.base={tmp_path / 'base.pt'}"), progress=False)
    model = simulator.setup.clients.model
    assert all(torch.equal(model.get_buffer(name), value) for name, value in saved["state_dict"].items())
    result = simulator.run()
    assert result.model_base["sha256"] and result.model_base["pretrained_on"] == record["pretrained_on"]
    other = tiny_run(f"model.base={tmp_path / 'base.pt'}", "model.options={width: 32, layers: 2, heads: 2}")
    with pytest.raises(ConfigError, match="is a base of char-transformer"):
        Simulator(other, progress=False)


@needs_texts
@pytest.mark.parametrize("method", ["pfedhn", "panacea"])
def test_a_hypernetwork_writes_each_roles_own_adapter(method: str) -> None:
    """Moving one role's embedding changes the adapter the hypernetwork writes for that role, and no other's."""
    simulator = Simulator(tiny_run(f"method.name={method}", "method.options={embedding_dim: 4}"), progress=False)
    server = simulator.setup.method
    clients = torch.arange(4)
    before = server.personalize(clients).detach()
    assert before.shape == (4, simulator.setup.spec.dim)
    with torch.no_grad():
        server.embeddings.weight[2] += 1.0
    after = server.personalize(clients).detach()
    moved = (after - before).abs().amax(dim=1) > 0
    # pFedHN: that role's adapter alone; Panacea's GNN carries the move to the role's neighbours too
    assert moved.tolist() == [False, False, True, False] if method == "pfedhn" else moved[2]
    # asked for some roles in another order, each gets its own adapter, not the one at its place in the request
    torch.testing.assert_close(server.personalize(torch.tensor([3, 1])).detach(), after[[3, 1]])


def test_the_loss_of_a_window_is_on_its_next_character() -> None:
    """The model's output for a window is the distribution of the character after it (the last position)."""
    torch.manual_seed(0)
    model = build_model("char-transformer", TEXT, TINY)  # type: ignore[arg-type]
    x = torch.randint(0, 80, (2, 80)).float()
    changed = x.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 80
    assert model(x).shape == (2, 80)
    assert not torch.allclose(model(x), model(changed))  # the first character is read (causal, not masked out)
    assert float(F.cross_entropy(model(x), torch.tensor([3, 4]))) > 0


def test_every_position_of_a_window_predicts_the_character_after_it() -> None:
    """Pretraining's per-position logits: causal (a position never reads a later character), the last position's
    are the model's output, and each position's target is the next character (the window's own, then ``y``)."""
    from graphfed.models.pretrained import next_characters

    torch.manual_seed(0)
    model = build_model("char-transformer", TEXT, TINY)  # type: ignore[arg-type]
    x = torch.randint(0, 80, (2, 80)).float()
    logits = model.sequence_logits(x)
    assert logits.shape == (2, 80, 80)
    torch.testing.assert_close(logits[:, -1], model(x))
    later = x.clone()
    later[:, 40] = (later[:, 40] + 1) % 80
    moved = (model.sequence_logits(later) - logits).abs().amax(dim=(0, 2)) > 1e-6
    assert not moved[:40].any() and moved[40]
    targets = next_characters(torch.tensor([[5.0, 6.0, 7.0]]), torch.tensor([8]))
    assert targets.tolist() == [[6, 7, 8]]


@needs_texts
@pytest.mark.parametrize("how", ["factors", "product"])
def test_product_aggregation_lands_on_the_mean_product_where_factor_averaging_halves_it(how: str) -> None:
    """Two clients whose adapters write u1 v1^T and u2 v2^T in different rank slots: the mean of their products is
    (u1 v1^T + u2 v2^T) / 2, which product aggregation recovers exactly (rank 2); averaging A and B on their own
    gives a quarter of each (the bias FedAvg of factors has)."""
    from graphfed.setup import build_setup

    setup = build_setup(tiny_run(f"method.options={{lora_aggregation: {how}}}"))
    method, spec = setup.method, setup.spec
    a, b = next((x, y) for x, y in method.lora_pairs() if x.name == "head.lora_A")
    u = torch.randn(2, b.shape[0])
    v = torch.randn(2, a.shape[1])
    trained = method.global_weights.unsqueeze(0).repeat(2, 1)
    for client in range(2):
        factor_b, factor_a = torch.zeros(b.shape), torch.zeros(a.shape)
        factor_b[:, client], factor_a[client] = u[client], v[client]
        trained[client, b.slice], trained[client, a.slice] = factor_b.reshape(-1), factor_a.reshape(-1)
    sent = method.global_weights.unsqueeze(0).repeat(2, 1)
    method.update(torch.tensor([0, 1]), sent, sent - trained, {"num_examples": torch.ones(2)})
    product = method.global_weights[b.slice].view(b.shape) @ method.global_weights[a.slice].view(a.shape)
    mean = (torch.outer(u[0], v[0]) + torch.outer(u[1], v[1])) / 2
    torch.testing.assert_close(product, mean if how == "product" else mean / 2, rtol=1e-4, atol=1e-5)
    assert spec.dim == method.global_weights.numel()


@needs_texts
def test_an_exported_adapter_carries_its_base_and_writes_what_predict_writes(tmp_path: Path) -> None:
    """The export holds the client's adapter and the frozen base it adapts (no data, no base file needed); loaded
    anywhere it goes on from a prompt as ``graphfed predict --prompt`` does; a file without its base is refused."""
    from typer.testing import CliRunner

    from graphfed.cli import app
    from graphfed.errors import UntrustedInputError
    from graphfed.export import deployed_model, export_client, generate, load_exported

    run_dir = tmp_path / "run"
    Simulator(tiny_run(), run_dir, progress=False).run()
    exported = export_client(run_dir, "macbeth.MACBETH", tmp_path / "macbeth.pt")
    prompt = "Is this a dagger which I see before me,"
    written = generate(load_exported(exported), prompt, 12)
    assert len(written) == 12 and written == generate(deployed_model(run_dir, "macbeth.MACBETH"), prompt, 12)
    shown = CliRunner().invoke(app, ["predict", str(run_dir), "--client", "macbeth.MACBETH", "--prompt", prompt,
                                     "--length", "12"])
    assert shown.exit_code == 0 and repr(written) in " ".join(shown.output.split())
    saved = torch.load(exported, weights_only=True)
    del saved["model"]["base_state"]
    torch.save(saved, tmp_path / "no_base.pt")
    with pytest.raises(UntrustedInputError, match="holds no base for its adapter"):
        load_exported(tmp_path / "no_base.pt")
