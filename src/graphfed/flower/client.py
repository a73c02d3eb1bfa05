"""The graphfed ClientApp: one Flower node = one graphfed client (its ``partition-id``).

The node builds its federation from the run's graphfed config and keeps only what it needs. Training and
evaluation call the same ``ClientRuntime`` the simulator uses, with one client.

Anything a client must remember between rounds (Ditto's personal model, FedRep's head...) is written to the
node's disk after each training round, one file per round under the run's token
(``<state-dir>/<run token>/client-<id>/round-<r>.pt``; node config ``state-dir``, default the user's cache
folder): in deployment every message may start a new process, a restarted SuperNode finds its client's state,
and a resumed run (which keeps its token) reads the state as of the round it resumes from: training in round
``r`` starts from the newest state before ``r``; evaluation in round ``r`` reads the newest up to ``r``. A node
keeps as many rounds as the server's checkpoint cadence needs.
"""

from __future__ import annotations

import functools
import io
import re
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp

from graphfed.client.executor import ArchitectureRuntime, ClientRuntime
from graphfed.client.placement import resolve_device
from graphfed.config import read_yaml, validate_config
from graphfed.data import build_federation
from graphfed.errors import ConfigError, UntrustedInputError
from graphfed.flower import protocol
from graphfed.flower.logs import user_errors_in_one_line
from graphfed.paths import user_cache_dir
from graphfed.runs import atomic_write_bytes
from graphfed.setup import ClientSide, resolve_method

client_app = ClientApp()
user_errors_in_one_line()  # a SuperNode's user error (a bad partition-id) is one line in its log


@functools.lru_cache(maxsize=2)
def _client_side(config_yaml: str, node_device: str | None = None) -> ClientSide:
    """Config, method, networks, client rules and data for a run, built once per process (the config text and the
    node's device are the cache key). ``node_device``: the SuperNode's node config ``device``, which wins over the
    run config's ``train.device`` (each machine of a deployment names its own accelerator)."""
    config = validate_config(read_yaml(config_yaml))
    refusal = protocol.deployment_refusal(config)
    if refusal:  # a node never draws its noise from a seed the server sent it
        raise ConfigError(refusal)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    device = resolve_device(node_device) if node_device is not None else None
    return ClientSide.build(config, build_federation(config.dataset, config.seed), resolve_method(config), device)


def node_client(context: Context) -> tuple[int, ClientSide]:
    """The client this node serves (its partition id, checked) and the run's client side, built once per process."""
    node_device = context.node_config.get(protocol.DEVICE_KEY)
    if node_device is not None and not isinstance(node_device, str):
        raise ConfigError(f"node config {protocol.DEVICE_KEY}={node_device!r}: give a device name "
                          f"(auto, cpu, cuda, cuda:N, mps)")
    side = _client_side(str(context.run_config[protocol.RUN_CONFIG_KEY]), node_device)
    if protocol.PARTITION_KEY not in context.node_config:
        raise ConfigError("this SuperNode has no node config 'partition-id'; start it with "
                         "--node-config \"partition-id=<client id> num-partitions=<clients>\"")
    raw, num_clients = context.node_config[protocol.PARTITION_KEY], side.federation.num_clients
    whole = isinstance(raw, int) and not isinstance(raw, bool)
    if not (whole or (isinstance(raw, str) and re.fullmatch(r"\s*-?\d+\s*", raw))):
        raise ConfigError(f"node config partition-id={raw!r} is not a client number; start the SuperNode with "
                          f"--node-config \"partition-id=<0..{num_clients - 1}> num-partitions={num_clients}\"")
    client_id = int(raw)
    if not 0 <= client_id < num_clients:
        raise ConfigError(f"node config partition-id={client_id} is outside the federation's clients "
                          f"0..{num_clients - 1}; start the SuperNode with --node-config \"partition-id=<0.."
                          f"{num_clients - 1}> num-partitions={num_clients}\"")
    return client_id, side


def client_runtime(side: ClientSide, context: Context, config: ConfigRecord | dict[str, Any], client_id: int,
                   before: int) -> ClientRuntime | ArchitectureRuntime:
    """The client's runtime with the state it saved in the newest round before ``before`` (see the module
    docstring), read from the node's disk."""
    runtime = side.executor(int(config["seed"]), torch.tensor([client_id]))
    saved = saved_state(context, config, client_id, before)  # type: ignore[arg-type]
    if saved is not None:
        runtime.runtime_of(client_id).store.load_state_dict(saved)
    return runtime


def _runtime(message: Message, context: Context) -> tuple[ClientRuntime | ArchitectureRuntime, int, torch.Tensor,
                                                          ConfigRecord, ClientSide]:
    """This node's client, with the method's client rule (built once from the run config) and the client's state
    (what it kept from earlier rounds) read from the node's disk. With mixed architectures the node builds its own
    architecture's network from the run config and its partition id."""
    client_id, side = node_client(context)
    config = message.content["config"]
    if int(config["client-id"]) != client_id:
        raise UntrustedInputError(f"message for client {config['client-id']} reached client {client_id}")
    weights = protocol.record_weights(message.content["arrays"])
    if weights.shape != (side.spec.dim,):
        raise UntrustedInputError(f"received {tuple(weights.shape)} weights, the model has {side.spec.dim}")
    weights = weights.to(side.device)  # the node's own device (its train.device; auto: its GPU if it has one)
    round_index = int(config["round"])
    # training in round r starts from the state before r; evaluation in round r scores the state after r's training
    before = round_index if message.metadata.message_type == MessageType.TRAIN else round_index + 1
    return client_runtime(side, context, config, client_id, before), client_id, weights, config, side


def _state_folder(context: Context, config: ConfigRecord, client_id: int) -> Path:
    """Where this node keeps the client's state for the message's run."""
    token = str(config.get(protocol.RUN_TOKEN_KEY, ""))
    if not re.fullmatch(r"[0-9a-f]{32}", token):
        raise UntrustedInputError("the message carries no run token graphfed's server sends (a server of another "
                                  "graphfed version?)")
    configured = context.node_config.get(protocol.STATE_DIR_KEY)
    root = Path(str(configured)).expanduser() if configured else user_cache_dir() / "node-state"
    return root / token / f"client-{client_id}"


def state_files(folder: Path, config: ConfigRecord) -> list[tuple[int, int, Path]]:
    """The client's saved states that belong to the run as the server now sees it, as (round, attempt, path),
    oldest first. A run resumed at round ``f`` (0-based index of the first round run again) makes every state
    an earlier attempt wrote from round ``f`` on stale: those files are removed."""
    resumes = protocol.resume_points(config)
    files = []
    for path in folder.glob("round-*.pt"):
        match = re.fullmatch(r"round-(\d{6})-(\d{3})\.pt", path.name)
        if match is None:
            continue
        round_index, attempt = int(match.group(1)), int(match.group(2))
        if attempt > len(resumes) or any(round_index >= point for point in resumes[attempt:]):
            path.unlink(missing_ok=True)  # written by an attempt the server has since rewound past
            continue
        files.append((round_index, attempt, path))
    return sorted(files)


def saved_state(context: Context, config: ConfigRecord, client_id: int, before: int) -> dict[str, Any] | None:
    folder = _state_folder(context, config, client_id)
    if not folder.is_dir():
        return None
    usable = [path for round_index, _, path in state_files(folder, config) if round_index < before]
    if not usable:
        return None
    try:
        return protocol.record_state(ArrayRecord(torch_state_dict=torch.load(usable[-1], weights_only=True)))
    except Exception as err:  # a damaged file on the node's disk: say which, never run on a half state
        raise UntrustedInputError(f"client state {usable[-1]} cannot be read ({type(err).__name__}); remove the "
                                  f"file to restart this client's state") from None


def keep_state(runtime: ClientRuntime | ArchitectureRuntime, client_id: int, context: Context,
                config: ConfigRecord, side: ClientSide) -> None:
    """Write the client's state after its local training in this round; drop what no resume can need (the server
    resumes at most ``flower.checkpoint_every`` rounds back)."""
    store = runtime.runtime_of(client_id).store
    folder = _state_folder(context, config, client_id)
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(protocol.state_record(store.state_dict()).to_torch_state_dict(), buffer)
    attempt = len(protocol.resume_points(config))
    atomic_write_bytes(folder / f"round-{int(config['round']):06d}-{attempt:03d}.pt", buffer.getvalue())
    files = state_files(folder, config)
    for _, _, stale in files[:-(side.config.flower.checkpoint_every + 1)]:
        stale.unlink(missing_ok=True)


def _remember(context: Context, key: str) -> None:
    """Per-client counters kept in the node's persistent state (shown in the ServerApp log on request)."""
    state = context.state["graphfed"] if "graphfed" in context.state else ConfigRecord({})
    state[key] = int(state.get(key, 0)) + 1
    context.state["graphfed"] = state


@client_app.query()
def query(message: Message, context: Context) -> Message:
    client_id, _ = node_client(context)
    return Message(RecordDict({"identity": ConfigRecord({protocol.PARTITION_KEY: client_id})}), reply_to=message)


@client_app.train()
def train(message: Message, context: Context) -> Message:
    runtime, client_id, weights, config, side = _runtime(message, context)
    ids = torch.tensor([client_id])
    purpose = str(config["purpose"])
    broadcast = None
    if "broadcast" in message.content:
        arrays = message.content["broadcast"].to_torch_state_dict()
        broadcast = {name: value.unsqueeze(0).to(runtime.device) for name, value in arrays.items()}
    steps = int(config["steps"]) if "steps" in config else None  # asked for besides the run's (novel clients)
    result = runtime.train(ids, weights.unsqueeze(0), int(config["round"]), purpose, steps, broadcast)
    if purpose == "local_training":  # the only training that changes a client's state
        keep_state(runtime, client_id, context, config, side)
    _remember(context, "rounds-trained")
    uploads = list(runtime.runtime_of(client_id).rule.upload_shapes()) if purpose == "local_training" else []
    return Message(protocol.train_reply(result.delta, result.metrics, client_id, uploads), reply_to=message)


@client_app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    runtime, client_id, weights, config, _ = _runtime(message, context)
    scores = runtime.evaluate(torch.tensor([client_id]), weights.unsqueeze(0), int(config["round"]))
    _remember(context, "evaluations")
    return Message(RecordDict({"metrics": protocol.scores_record(scores)}), reply_to=message)
