"""The server side of the Flower engine: graphfed's own push/pull loop over a Flower ``Grid``.

``FlowerExecutor`` is a ``ClientExecutor``: the simulator's round loop (sampling, method updates,
evaluation, checkpoints, summaries) runs unchanged and hands client work to Flower nodes. Each selected
node gets its OWN personalised weights in one message. Nodes that error, time out or disconnect are
dropped from that round (logged) and the round completes with the rest; replies with NaN/Inf or the
wrong shape are rejected (logged) and never reach the method.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import replace

import torch
from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid

from graphfed.config import RunConfig
from graphfed.flower import protocol
from graphfed.sim.client import ClientScores, LocalTraining
from graphfed.sim.engine import Setup
from graphfed.sim.executor import ClientExecutor, TrainResult

log = logging.getLogger("graphfed.flower")


class FlowerExecutor(ClientExecutor):
    def __init__(self, grid: Grid, config: RunConfig, setup: Setup) -> None:
        self.grid = grid
        self.config = config
        self.dim = setup.spec.dim
        self.num_clients = setup.federation.num_clients
        self.training: LocalTraining = setup.client_rule.setting.training  # what the simulator's clients run
        #: what each node must upload besides its delta (its client rule's extra arrays), checked on arrival
        self.upload_shapes = setup.client_rule.upload_shapes()
        self.node_of_client: dict[int, int] = {}
        self.known_nodes: set[int] = set()
        #: what happened to clients, for the run's log and tests: (round, client id, reason)
        self.dropped: list[tuple[int, int, str]] = []

    # ---- node <-> client identity ------------------------------------------------------------------
    def wait_for_nodes(self) -> None:
        """Nodes connect one by one; start round 1 once ``flower.min_nodes`` are there (or the wait ends)."""
        wanted = self.config.flower.min_nodes or self.num_clients
        deadline = time.monotonic() + self.config.flower.node_wait_timeout
        while (connected := len(list(self.grid.get_node_ids()))) < wanted and time.monotonic() < deadline:
            time.sleep(1.0)
        if connected < wanted:
            log.warning("only %d of %d nodes connected after %.0f s; starting anyway", connected, wanted,
                        self.config.flower.node_wait_timeout)

    def discover(self) -> None:
        """Ask nodes not seen before for their client id (node ids are random, partition ids are stable)."""
        live = set(self.grid.get_node_ids())
        for client_id, node_id in list(self.node_of_client.items()):
            if node_id not in live:
                log.warning("client %d (node %d) left the federation", client_id, node_id)
                del self.node_of_client[client_id]
        self.known_nodes &= live
        new_nodes = sorted(live - self.known_nodes)
        if not new_nodes:
            return
        messages = [Message(RecordDict({}), dst_node_id=node, message_type=MessageType.QUERY) for node in new_nodes]
        for reply in self.grid.send_and_receive(messages, timeout=self.config.flower.query_timeout):
            node = reply.metadata.src_node_id
            if reply.has_error():
                log.warning("node %d did not tell its client id: %s", node, reply.error.reason)
                continue
            client_id = int(reply.content["identity"][protocol.PARTITION_KEY])
            if not 0 <= client_id < self.num_clients:
                log.warning("node %d claims client %d, outside 0..%d; ignored", node, client_id, self.num_clients - 1)
                continue
            if client_id in self.node_of_client and self.node_of_client[client_id] != node:
                log.warning("client %d moved from node %d to node %d", client_id, self.node_of_client[client_id], node)
            self.node_of_client[client_id] = node
            self.known_nodes.add(node)
        log.info("%d of %d clients have a node", len(self.node_of_client), self.num_clients)

    def _drop(self, round_index: int, client_id: int, reason: str) -> None:
        self.dropped.append((round_index + 1, client_id, reason))
        log.warning("round %d: client %d dropped: %s", round_index + 1, client_id, reason)

    def _exchange(self, client_ids: torch.Tensor, contents: list[RecordDict], message_type: str,
                  round_index: int) -> dict[int, Message]:
        """Send one message per client that has a node; return the good replies by client id."""
        self.discover()
        messages, client_of_node = [], {}
        for client_id, content in zip(client_ids.tolist(), contents, strict=True):
            node = self.node_of_client.get(client_id)
            if node is None:
                self._drop(round_index, client_id, "no node serves this client")
                continue
            client_of_node[node] = client_id
            messages.append(Message(content, dst_node_id=node, message_type=message_type,
                                    group_id=str(round_index + 1)))
        replies: dict[int, Message] = {}
        received: Iterable[Message] = self.grid.send_and_receive(messages, timeout=self.config.flower.round_timeout)
        # The SuperLink answers for a node it declared unavailable, so match replies to the message they
        # answer, falling back to the sender.
        client_of_message = {m.metadata.message_id: client_of_node[m.metadata.dst_node_id] for m in messages
                             if m.metadata.message_id}
        for reply in received:
            client_id = client_of_message.get(reply.metadata.reply_to_message_id,
                                              client_of_node.get(reply.metadata.src_node_id))
            if client_id is None:
                continue
            if reply.has_error():
                self._drop(round_index, client_id, f"error reply: {reply.error.reason}")
                continue
            replies[client_id] = reply
        for client_id in client_of_node.values():
            if client_id not in replies and not any(d[:2] == (round_index + 1, client_id) for d in self.dropped):
                self._drop(round_index, client_id, "no reply before the timeout (node failed or disconnected)")
        return replies

    # ---- ClientExecutor --------------------------------------------------------------------------------
    def train(self, client_ids: torch.Tensor, start: torch.Tensor, round_index: int, purpose: str,
              steps: int | None = None, broadcast: dict[str, torch.Tensor] | None = None) -> TrainResult:
        training = self.training if steps is None else replace(self.training, steps=steps)
        contents = []
        for row, client_id in enumerate(client_ids.tolist()):
            content = protocol.train_content(start[row], client_id, round_index, purpose, self.config.seed, training)
            if broadcast:
                content["broadcast"] = protocol.named_arrays({name: value[row] for name, value in broadcast.items()})
            contents.append(content)
        upload_shapes = self.upload_shapes if purpose == "local_training" else {}
        replies = self._exchange(client_ids, contents, MessageType.TRAIN, round_index)
        rows, deltas, metrics = [], [], []
        for row, client_id in enumerate(client_ids.tolist()):
            reply = replies.get(client_id)
            if reply is None:
                continue
            try:
                delta = protocol.record_weights(reply.content["delta"])
                reply_metrics = protocol.reply_metrics(reply.content["metrics"])
                if training.feedback != "none" and purpose == "local_training":
                    reply_metrics.update(protocol.reply_feedback(reply.content, self.config.seed, round_index,
                                                                 client_id))
                if upload_shapes:
                    reply_metrics.update(protocol.record_named_arrays(reply.content["uploads"], upload_shapes))
            except (KeyError, ValueError, TypeError) as err:
                self._drop(round_index, client_id, f"malformed reply ({err})")
                continue
            if delta.shape != (self.dim,):
                self._drop(round_index, client_id, f"update of shape {tuple(delta.shape)}, expected ({self.dim},)")
                continue
            if not torch.isfinite(delta).all():
                self._drop(round_index, client_id, "non-finite (NaN/Inf) update rejected")
                continue
            rows.append(row)
            deltas.append(delta)
            metrics.append(reply_metrics)
        index = torch.tensor(rows, dtype=torch.long)
        keys = metrics[0].keys() if metrics else ("num_examples", "loss_first", "loss_last")
        merged = {key: torch.cat([m[key] for m in metrics]) if metrics else torch.zeros(0) for key in keys}
        stacked = torch.stack(deltas) if deltas else torch.zeros(0, self.dim)
        return TrainResult(index, client_ids[index], stacked, merged)

    def evaluate(self, client_ids: torch.Tensor, weights: torch.Tensor, round_index: int) -> dict[str, ClientScores]:
        contents = [protocol.train_content(weights[row], client_id, round_index, "evaluation", self.config.seed,
                                           self.training) for row, client_id in enumerate(client_ids.tolist())]
        replies = self._exchange(client_ids, contents, MessageType.EVALUATE, round_index)
        scores: dict[str, list[ClientScores]] = {"val": [], "test": []}
        for client_id in client_ids.tolist():
            for split, parts in scores.items():
                reply = replies.get(client_id)
                parts.append(protocol.record_scores(reply.content["metrics"], split) if reply
                             else protocol.missing_scores())
        return {split: ClientScores.concat(parts) for split, parts in scores.items()}
