"""The graphfed ClientApp: one Flower node = one graphfed client (its ``partition-id``).

The node builds its federation from the run's graphfed config and keeps only what it needs. Training and
evaluation call the same ``ClientRuntime`` the simulator uses, with one client. Anything a client must
remember between rounds lives in ``context.state`` (in deployment every message may start a new process).
"""

from __future__ import annotations

import functools

import torch
import yaml
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from graphfed.client.executor import ArchitectureRuntime, ClientRuntime
from graphfed.client.placement import resolve_device
from graphfed.config import validate_config
from graphfed.data import build_federation
from graphfed.errors import ConfigError, UntrustedInputError
from graphfed.flower import protocol
from graphfed.setup import ClientSide, resolve_method

client_app = ClientApp()


@functools.lru_cache(maxsize=2)
def _client_side(config_yaml: str, node_device: str | None = None) -> ClientSide:
    """Config, method, networks, client rules and data for a run, built once per process (the config text and the
    node's device are the cache key). ``node_device``: the SuperNode's node config ``device``, which wins over the
    run config's ``train.device`` (each machine of a deployment names its own accelerator)."""
    config = validate_config(yaml.safe_load(config_yaml))
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    device = resolve_device(node_device) if node_device is not None else None
    return ClientSide.build(config, build_federation(config.dataset, config.seed), resolve_method(config), device)


def _client_id(context: Context) -> tuple[int, ClientSide]:
    node_device = context.node_config.get(protocol.DEVICE_KEY)
    if node_device is not None and not isinstance(node_device, str):
        raise ConfigError(f"node config {protocol.DEVICE_KEY}={node_device!r}: give a device name "
                          f"(auto, cpu, cuda, cuda:N, mps)")
    side = _client_side(str(context.run_config[protocol.RUN_CONFIG_KEY]), node_device)
    if protocol.PARTITION_KEY not in context.node_config:
        raise ConfigError("this SuperNode has no node config 'partition-id'; start it with "
                         "--node-config \"partition-id=<client id> num-partitions=<clients>\"")
    client_id = int(context.node_config[protocol.PARTITION_KEY])
    num_clients = side.federation.num_clients
    if not 0 <= client_id < num_clients:
        raise ConfigError(f"partition-id {client_id} is outside the federation's clients 0..{num_clients - 1}")
    return client_id, side


def _runtime(message: Message, context: Context) -> tuple[ClientRuntime | ArchitectureRuntime, int, torch.Tensor,
                                                          ConfigRecord]:
    """This node's client, with the method's client rule (built once from the run config) and the client's state
    (what it kept from earlier rounds) restored from ``context.state``. With mixed architectures the node builds
    its own architecture's network from the run config and its partition id."""
    client_id, side = _client_id(context)
    config = message.content["config"]
    if int(config["client-id"]) != client_id:
        raise UntrustedInputError(f"message for client {config['client-id']} reached client {client_id}")
    weights = protocol.record_weights(message.content["arrays"])
    if weights.shape != (side.spec.dim,):
        raise UntrustedInputError(f"received {tuple(weights.shape)} weights, the model has {side.spec.dim}")
    weights = weights.to(side.device)  # the node's own device (its train.device; auto: its GPU if it has one)
    runtime = side.executor(int(config["seed"]), torch.tensor([client_id]))
    if protocol.CLIENT_STATE_KEY in context.state:
        store = runtime.runtime_of(client_id).store
        store.load_state_dict(protocol.record_state(context.state[protocol.CLIENT_STATE_KEY]))
    return runtime, client_id, weights, config


def _keep_state(runtime: ClientRuntime | ArchitectureRuntime, client_id: int, context: Context) -> None:
    """Persist the client's state in the node (in deployment every message may start a new process)."""
    store = runtime.runtime_of(client_id).store
    context.state[protocol.CLIENT_STATE_KEY] = protocol.state_record(store.state_dict())


def _remember(context: Context, key: str) -> None:
    """Per-client counters kept in the node's persistent state (shown in the ServerApp log on request)."""
    state = context.state["graphfed"] if "graphfed" in context.state else ConfigRecord({})
    state[key] = int(state.get(key, 0)) + 1
    context.state["graphfed"] = state


@client_app.query()
def query(message: Message, context: Context) -> Message:
    client_id, _ = _client_id(context)
    return Message(RecordDict({"identity": ConfigRecord({protocol.PARTITION_KEY: client_id})}), reply_to=message)


@client_app.train()
def train(message: Message, context: Context) -> Message:
    runtime, client_id, weights, config = _runtime(message, context)
    ids = torch.tensor([client_id])
    purpose = str(config["purpose"])
    broadcast = None
    if "broadcast" in message.content:
        arrays = message.content["broadcast"].to_torch_state_dict()
        broadcast = {name: value.unsqueeze(0).to(runtime.device) for name, value in arrays.items()}
    steps = int(config["steps"]) if "steps" in config else None  # asked for besides the run's (novel clients)
    result = runtime.train(ids, weights.unsqueeze(0), int(config["round"]), purpose, steps, broadcast)
    _keep_state(runtime, client_id, context)
    _remember(context, "rounds-trained")
    uploads = list(runtime.runtime_of(client_id).rule.upload_shapes()) if purpose == "local_training" else []
    return Message(protocol.train_reply(result.delta, result.metrics, client_id, uploads), reply_to=message)


@client_app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    runtime, client_id, weights, config = _runtime(message, context)
    scores = runtime.evaluate(torch.tensor([client_id]), weights.unsqueeze(0), int(config["round"]))
    _remember(context, "evaluations")
    return Message(RecordDict({"metrics": protocol.scores_record(scores)}), reply_to=message)
