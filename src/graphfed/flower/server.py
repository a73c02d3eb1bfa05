"""The server side of the Flower engine: graphfed's own push/pull loop over a Flower ``Grid``.

``FlowerExecutor`` is a ``ClientExecutor``: the simulator's round loop (sampling, method updates,
evaluation, checkpoints, summaries) runs unchanged and hands client work to Flower nodes. Each selected
node gets its OWN personalised weights in one message. Nodes that error, time out or disconnect are
dropped from that round (logged) and the round completes with the rest, unless fewer than
``flower.min_replies`` arrived: then the run stops, its last checkpoint kept, and resumes when started again.

A client's identity is its partition id, not its node: a SuperNode restarted with the same partition id
(a new node id) takes the client over once its old node has left the federation, and the summary lists
the rounds the client missed (``missed_rounds``). Every message carries the run's token (kept in the
checkpoint), under which nodes keep their clients' state on disk: a resumed run, or a restarted node,
finds its state where the run left it.

A node's reply is input, validated like a config (``protocol.check_train_reply`` / ``check_evaluation_reply``):
every record and field must be the one asked for, of the right dtype and shape, finite and in range (the server
knows each client's row counts from the run config). A reply that fails is dropped for that round (logged and
counted in ``summary.json``): it never reaches the method, never enters model selection. A node may not claim a
partition id another node has served in this run.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid

from graphfed.client.contract import LocalTraining
from graphfed.client.evaluation import ClientScores
from graphfed.client.executor import Collected, SubmittingExecutor, TrainResult
from graphfed.config import ConfigError, RunConfig
from graphfed.errors import RunStoppedError
from graphfed.flower import protocol
from graphfed.runs import missed_rounds
from graphfed.setup import Setup

log = logging.getLogger("graphfed.flower")


class FlowerExecutor(SubmittingExecutor):
    remote = True  # clients keep their state on their nodes
    def __init__(self, grid: Grid, config: RunConfig, setup: Setup) -> None:
        refusal = protocol.deployment_refusal(config)
        if refusal:
            raise ConfigError(refusal)
        self.grid = grid
        self.config = config
        self.dim = setup.spec.dim
        self.device = setup.clients.device  # replies arrive on the host; the server's method lives here
        self.num_clients = setup.federation.num_clients
        self.training: LocalTraining = setup.training  # what every node's clients run (each resolves it too)
        #: what each node must upload besides its delta (its client rule's extra arrays), checked on arrival
        self.upload_shapes = setup.client_rule.upload_shapes()
        #: the data as the clients hold it (the server builds the same federation): row counts replies must match
        self.federation = setup.clients.federation
        self.node_of_client: dict[int, int] = {}
        #: every partition id claimed in this run and the node that claimed it first (it stays that node's)
        self.claimed_by: dict[int, int] = {}
        self.known_nodes: set[int] = set()
        #: what happened to clients, for the run's log and tests: (round, client id, reason)
        self.dropped: list[tuple[int, int, str]] = []
        #: how many drops of each kind: no_node, error, timeout, invalid_reply
        self.drop_counts: Counter[str] = Counter()
        #: nodes refused at identification: (node id, claimed partition id, reason)
        self.refused_nodes: list[tuple[int, object, str]] = []
        #: nodes that claimed a client still served by a live node: node -> client id (admitted once that node left)
        self.waiting: dict[int, int] = {}
        #: clients taken over by a new node after their node left: (round, client id, old node, new node)
        self.readmitted: list[tuple[int, int, int, int]] = []
        self.round_number = 0  # the round being served (1-based; 0 before round 1), for the logs and the summary
        #: names the run's client state on the nodes; a resumed run keeps its token (``load_state_dict``)
        self.run_token = uuid.uuid4().hex
        #: the round index each resume of this run started again at (nodes drop state written after it)
        self.resumes: list[int] = []
        #: asynchronous rounds (train.server_mode fedbuff / fedasync): evaluations wait for no straggler
        self.asynchronous = config.train.server_mode != "sync"
        #: asynchronous rounds: the training submitted and not yet answered, by message id
        self.pending: dict[str, PendingWork] = {}
        #: asynchronous rounds: clients whose submitted training ended without an update, not yet collected
        self.lost: list[int] = []
        #: asynchronous rounds: clients whose last training timed out and that have not answered since
        self.unanswered: set[int] = set()
        #: asynchronous rounds: seconds from sending training to its reply, of the latest replies
        self.latencies: deque[float] = deque(maxlen=64)
        #: asynchronous rounds: training messages sent to each client (its node's TRAIN messages)
        self.trainings_sent: Counter[int] = Counter()

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
        for node, client_id in list(self.waiting.items()):
            if node not in live:
                del self.waiting[node]
            elif client_id not in self.node_of_client:  # the node that served it has left: the client is back
                del self.waiting[node]
                self._admit(node, client_id)
        new_nodes = sorted(live - self.known_nodes)
        if not new_nodes:
            return
        messages = [Message(RecordDict({}), dst_node_id=node, message_type=MessageType.QUERY) for node in new_nodes]
        for reply in self.grid.send_and_receive(messages, timeout=self.config.flower.query_timeout):
            node = reply.metadata.src_node_id
            if reply.has_error():
                log.warning("node %d did not tell its client id: %s", node, reply.error.reason)
                continue
            try:
                client_id = protocol.check_identity(reply.content, self.num_clients)
            except Exception as err:  # a node's reply is untrusted input: refuse it, never crash
                self._refuse(node, None, f"invalid identity reply ({_reason(err)})")
                continue
            owner = self.claimed_by.setdefault(client_id, node)
            if owner != node and self.node_of_client.get(client_id, owner) in live:
                # two live nodes claim one client: the first keeps it; this one waits until that node has left
                self._refuse(node, client_id, f"partition id {client_id} is already served by node {owner} in this "
                                              f"run (it takes the client over if that node leaves)")
                self.waiting[node] = client_id
                continue
            self._admit(node, client_id)
        log.info("%d of %d clients have a node", len(self.node_of_client), self.num_clients)

    def _admit(self, node: int, client_id: int) -> None:
        previous = self.claimed_by[client_id]
        if previous != node:
            self.readmitted.append((self.round_number, client_id, previous, node))
            log.warning("client %d is back on node %d (its node %d left)", client_id, node, previous)
        self.claimed_by[client_id] = node
        self.node_of_client[client_id] = node
        self.known_nodes.add(node)

    def _refuse(self, node: int, client_id: int | None, reason: str) -> None:
        """A node that will not serve in this run (it is not asked again)."""
        self.refused_nodes.append((node, client_id, reason))
        self.known_nodes.add(node)
        log.warning("node %d refused: %s", node, reason)

    def _drop(self, round_index: int, client_id: int, reason: str, kind: str, once_per_round: bool = True) -> None:
        """Record that ``client_id`` missed round ``round_index + 1``: once per client and round (a client whose
        node is gone misses the round's training and its evaluation; that is one drop, named by the first).
        Asynchronous rounds record each lost update (``once_per_round=False``): a client has one training out at a
        time, and its loss is not the evaluation it missed."""
        if once_per_round and any(r == round_index + 1 and c == client_id for r, c, _ in self.dropped):
            log.warning("round %d: client %d dropped again: %s", round_index + 1, client_id, reason)
            return
        self.dropped.append((round_index + 1, client_id, reason))
        self.drop_counts[kind] += 1
        log.warning("round %d: client %d dropped: %s", round_index + 1, client_id, reason)

    def result_fields(self) -> dict[str, Any]:
        """What only the Flower engine knows, for the run's result: clients dropped from rounds (and so the rounds
        each missed), nodes refused, clients that came back on a new node."""
        names = self.federation.client_names
        missed = missed_rounds((round_number, names[client_id]) for round_number, client_id, _ in self.dropped)
        return {"dropped_clients": [{"round": r, "client": c, "reason": why} for r, c, why in self.dropped],
                "drop_counts": {kind: self.drop_counts[kind] for kind in DROP_KINDS},
                "refused_nodes": [{"node": node, "claimed": claimed, "reason": why}
                                  for node, claimed, why in self.refused_nodes],
                "missed_rounds": missed,
                "resumed_at": list(self.resumes),  # the completed rounds each resume continued after
                "readmitted": [{"round": r, "client": c, "old_node": old, "new_node": new}
                               for r, c, old, new in self.readmitted],
                # asynchronous rounds: the training messages each client's node was sent
                **({"trainings_sent": {names[c]: self.trainings_sent[c] for c in sorted(self.trainings_sent)}}
                   if self.trainings_sent else {})}

    def state_dict(self) -> dict[str, Any]:
        """The server's part of its clients: the run token under which nodes keep their clients' state, and what
        happened to nodes so far (a resumed run's summary still counts the faults before the restart)."""
        return {"flower": {"run_token": self.run_token, "resumes": list(self.resumes),
                           "round_number": self.round_number, "dropped": [list(d) for d in self.dropped],
                           "drop_counts": dict(self.drop_counts),
                           "readmitted": [list(r) for r in self.readmitted],
                           "trainings_sent": {str(client): n for client, n in self.trainings_sent.items()}}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:  # a checkpoint from before the run token: the nodes' state under it is lost, start afresh
            return
        flower = state["flower"]
        token = flower["run_token"]
        if not (isinstance(token, str) and len(token) == 32 and all(c in "0123456789abcdef" for c in token)):
            raise ValueError("the checkpoint's run token is not one graphfed writes")
        self.run_token = token
        # this attempt runs again from the round after the checkpoint's last one
        self.resumes = [int(point) for point in flower["resumes"]] + [int(flower["round_number"])]
        self.round_number = int(flower["round_number"])
        self.dropped = [(int(r), int(c), str(why)) for r, c, why in flower["dropped"]]
        self.drop_counts = Counter({str(kind): int(n) for kind, n in flower["drop_counts"].items()})
        self.readmitted = [(int(r), int(c), int(old), int(new)) for r, c, old, new in flower["readmitted"]]
        self.trainings_sent = Counter({int(client): int(n) for client, n in flower.get("trainings_sent", {}).items()})

    def _exchange(self, client_ids: torch.Tensor, contents: list[RecordDict], message_type: str,
                  round_index: int) -> dict[int, Message]:
        """Send one message per client that has a node; return the good replies by client id."""
        self.round_number = round_index + 1
        self.discover()
        messages, client_of_node = [], {}
        for client_id, content in zip(client_ids.tolist(), contents, strict=True):
            node = self.node_of_client.get(client_id)
            if node is None:
                self._drop(round_index, client_id, "no node serves this client", "no_node")
                continue
            if client_id in self.unanswered:  # asynchronous rounds: a silent node would hold the evaluation up
                self._drop(round_index, client_id, "its node has not answered since it went silent", "timeout")
                continue
            client_of_node[node] = client_id
            # a reply after the timeout is never read: the message need not outlive it on the SuperLink
            messages.append(Message(content, dst_node_id=node, message_type=message_type,
                                    group_id=str(round_index + 1), ttl=self.config.flower.round_timeout))
        replies: dict[int, Message] = {}
        cut_short = False
        received: Iterable[Message]
        if self.asynchronous and message_type == MessageType.EVALUATE:
            received, cut_short = self._receive_without_stragglers(messages, client_of_node)
        else:
            received = self.grid.send_and_receive(messages, timeout=self.config.flower.round_timeout)
        # The SuperLink answers for a node it declared unavailable, so match replies to the message they
        # answer, falling back to the sender.
        client_of_message = {m.metadata.message_id: client_of_node[m.metadata.dst_node_id] for m in messages
                             if m.metadata.message_id}
        for reply in received:
            client_id = client_of_message.get(reply.metadata.reply_to_message_id,
                                              client_of_node.get(reply.metadata.src_node_id))
            if client_id is None or client_id in replies:
                continue
            if reply.has_error():
                self._drop(round_index, client_id, f"error reply: {reply.error.reason}", "error")
                continue
            if reply.metadata.src_node_id != self.node_of_client.get(client_id):
                self._drop(round_index, client_id, f"reply from node {reply.metadata.src_node_id}, not the client's",
                           "invalid_reply")
                continue
            replies[client_id] = reply
        for client_id in client_of_node.values():
            if client_id not in replies and not any(d[:2] == (round_index + 1, client_id) for d in self.dropped):
                why = (f"its node was silent for over {self.config.flower.async_evaluation_wait:g}x the nodes' median "
                       f"training reply time (asynchronous rounds wait for no straggler)" if cut_short
                       else "no reply before the timeout (node failed or disconnected)")
                self._drop(round_index, client_id, why, "timeout")
        return replies

    def _receive_without_stragglers(self, messages: list[Message],
                                    client_of_node: dict[int, int]) -> tuple[list[Message], bool]:
        """Push ``messages`` and pull their replies until all are in or ``flower.round_timeout`` passes, giving up
        on a node once it has been silent (no reply to its training in flight, or to this message) for
        ``flower.async_evaluation_wait`` times the nodes' median training reply time; returns the replies and
        whether a node was given up on."""
        pushed = {message_id: client_of_node[message.metadata.dst_node_id]
                  for message_id, message in zip(self.grid.push_messages(messages), messages, strict=True)
                  if message_id}
        began = time.monotonic()
        training_since = {work.client: work.sent_at for work in self.pending.values()}
        silent_since = {message_id: min(training_since.get(client, began), began)
                        for message_id, client in pushed.items()}
        waiting, received, given_up = set(pushed), [], False
        while waiting and time.monotonic() < began + self.config.flower.round_timeout:
            arrived = list(self.grid.pull_messages(list(waiting)))
            received += arrived
            waiting -= {reply.metadata.reply_to_message_id for reply in arrived}
            if self.latencies:  # a straggler: silent for a multiple of what a node takes to train
                patience = self.config.flower.async_evaluation_wait * statistics.median(self.latencies)
                stragglers = {m for m in waiting if time.monotonic() - silent_since[m] > patience}
                given_up |= bool(stragglers)
                waiting -= stragglers
                # not waited for again until it answers something (its training reply clears this)
                self.unanswered.update(pushed[m] for m in stragglers)
            if waiting and not arrived:
                time.sleep(POLL_SECONDS)
        return received, given_up

    # ---- ClientExecutor --------------------------------------------------------------------------------
    def _train_content(self, start: torch.Tensor, client_id: int, round_index: int, purpose: str,
                       steps: int | None, broadcast: dict[str, torch.Tensor] | None) -> RecordDict:
        """One client's training message: its weights ``start [dim]`` and its row of ``broadcast``."""
        content = protocol.train_content(start, client_id, round_index, purpose, self.config.seed, steps,
                                         self.run_token, tuple(self.resumes))
        if broadcast:
            content["broadcast"] = protocol.named_arrays(broadcast)
        return content

    def _checked_update(self, reply: Message, client_id: int, round_index: int, purpose: str,
                        serving: int | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
        """A training reply's delta and metrics, validated; None (and the drop recorded) when it fails.
        ``serving``: asynchronous rounds, the server step the reply arrived in (where a drop is recorded)."""
        feedback = self.training.feedback if purpose == "local_training" else "none"
        feedback_shape = {"none": None, "val_gradient": (self.dim,), "val_loss_pair": (2,)}[feedback]
        expect = protocol.TrainExpectation(client_id, self.dim, int(self.federation.train.counts[client_id]),
                                           feedback_shape, self.upload_shapes if purpose == "local_training" else {})
        try:
            delta, reply_metrics = protocol.check_train_reply(reply.content, expect)
        except Exception as err:  # a node's reply is untrusted input: drop it, never crash
            self._drop(round_index if serving is None else serving, client_id,
                       f"invalid reply rejected ({_reason(err)})", "invalid_reply", once_per_round=serving is None)
            return None
        if feedback_shape:
            reply_metrics.update(protocol.feedback_seed(self.config.seed, round_index, client_id))
        return delta, reply_metrics

    def _result(self, client_ids: torch.Tensor, rows: list[int],
                updates: list[tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> TrainResult:
        """The updates that arrived, in the order of ``rows``, as one TrainResult on the server's device."""
        index = torch.tensor(rows, dtype=torch.long, device="cpu")
        keys = updates[0][1].keys() if updates else ("num_examples", "loss_first", "loss_last")
        merged = {key: torch.cat([m[key] for _, m in updates]).to(self.device) if updates
                  else torch.zeros(0, device=self.device) for key in keys}
        stacked = (torch.stack([d for d, _ in updates]) if updates else torch.zeros(0, self.dim)).to(self.device)
        return TrainResult(index, client_ids[index], stacked, merged)

    def train(self, client_ids: torch.Tensor, start: torch.Tensor, round_index: int, purpose: str,
              steps: int | None = None, broadcast: dict[str, torch.Tensor] | None = None) -> TrainResult:
        contents = [self._train_content(start[row], client_id, round_index, purpose, steps,
                                        {name: value[row] for name, value in (broadcast or {}).items()})
                    for row, client_id in enumerate(client_ids.tolist())]
        replies = self._exchange(client_ids, contents, MessageType.TRAIN, round_index)
        rows, updates = [], []
        for row, client_id in enumerate(client_ids.tolist()):
            reply = replies.get(client_id)
            update = None if reply is None else self._checked_update(reply, client_id, round_index, purpose)
            if update is not None:
                rows.append(row)
                updates.append(update)
        wanted = min(self.config.flower.min_replies or 0, len(client_ids))
        if purpose == "local_training" and len(rows) < wanted:
            raise PartialCohortError(f"round {round_index + 1}: {len(rows)} of {len(client_ids)} training replies "
                                     f"arrived, flower.min_replies is {self.config.flower.min_replies}; start the "
                                     f"run again to resume from its last checkpoint")
        return self._result(client_ids, rows, updates)

    # ---- asynchronous rounds: training submitted without waiting, its replies collected as they come -------------
    def submit(self, client_ids: torch.Tensor, start: torch.Tensor, round_index: int,
               broadcast: dict[str, torch.Tensor] | None = None) -> None:
        """Send each client its training message and return at once. The message lives ``flower.round_timeout``
        seconds on the SuperLink (a node stopped longer never trains on weights that old); a reply not here by
        then is dropped (``collect``) and the client counts as unanswered until it answers."""
        self.round_number = round_index + 1
        self.discover()
        timeout = self.config.flower.round_timeout
        for row, client_id in enumerate(client_ids.tolist()):
            node = self.node_of_client.get(client_id)
            if node is None:
                self._drop(round_index, client_id, "no node serves this client", "no_node")
                self.lost.append(client_id)
                continue
            content = self._train_content(start[row], client_id, round_index, "local_training", None,
                                          {name: value[row] for name, value in (broadcast or {}).items()})
            message = Message(content, dst_node_id=node, message_type=MessageType.TRAIN,
                              group_id=str(round_index + 1), ttl=timeout)
            message_ids = list(self.grid.push_messages([message]))
            if not message_ids or not message_ids[0]:
                self._drop(round_index, client_id, "the SuperLink did not take its training message", "error")
                self.lost.append(client_id)
                continue
            now = time.monotonic()
            self.pending[message_ids[0]] = PendingWork(client_id, node, round_index, now, now + timeout)
            self.trainings_sent[client_id] += 1

    def collect(self, wait: float) -> Collected:
        """The submitted training that ended, polling the SuperLink until something ends or ``wait`` s pass."""
        deadline = time.monotonic() + wait
        if not self.pending:  # nothing to wait for: look for nodes that joined or came back
            self.discover()
        arrived: list[tuple[int, tuple[torch.Tensor, dict[str, torch.Tensor]]]] = []
        while True:
            arrived += self._pull_training()
            busy = {work.client for work in self.pending.values()}
            free = [client for client in sorted(self.node_of_client) if client not in busy]
            if arrived or self.lost or time.monotonic() >= deadline or (free and not self.pending):
                break
            time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        lost, self.lost = self.lost, []
        ids = torch.tensor([client for client, _ in arrived], dtype=torch.long)
        result = self._result(ids, list(range(len(arrived))), [update for _, update in arrived])
        return Collected(result, lost, [c for c in free if c not in self.unanswered],
                         [c for c in free if c in self.unanswered], dict(self.trainings_sent))

    def _serving(self) -> int:
        """The round (server step, 0-based) being served: an asynchronous drop counts in the step it was seen in."""
        return max(self.round_number - 1, 0)

    def _pull_training(self) -> list[tuple[int, tuple[torch.Tensor, dict[str, torch.Tensor]]]]:
        """Replies to the submitted training that came in (validated), and the drops of those that timed out."""
        arrived = []
        if self.pending:
            for reply in self.grid.pull_messages(list(self.pending)):
                work = self.pending.pop(reply.metadata.reply_to_message_id, None)
                if work is None:
                    continue
                if reply.has_error():
                    self._drop(self._serving(), work.client, f"error reply: {reply.error.reason}", "error", False)
                elif reply.metadata.src_node_id != work.node:
                    self._drop(self._serving(), work.client, f"reply from node {reply.metadata.src_node_id}, not "
                               f"the client's", "invalid_reply", False)
                elif (update := self._checked_update(reply, work.client, work.round_index, "local_training",
                                                     self._serving())):
                    self.unanswered.discard(work.client)
                    self.latencies.append(time.monotonic() - work.sent_at)
                    arrived.append((work.client, update))
                    continue
                self.lost.append(work.client)
        now = time.monotonic()
        for message_id, work in list(self.pending.items()):
            if now >= work.deadline:
                del self.pending[message_id]
                self._drop(self._serving(), work.client, f"no reply in {self.config.flower.round_timeout:g} s "
                           f"(node stopped, failed or disconnected)", "timeout", False)
                self.unanswered.add(work.client)
                self.lost.append(work.client)
        return arrived

    def evaluate(self, client_ids: torch.Tensor, weights: torch.Tensor, round_index: int) -> dict[str, ClientScores]:
        contents = [protocol.train_content(weights[row], client_id, round_index, "evaluation", self.config.seed,
                                           run_token=self.run_token, resumes=tuple(self.resumes))
                    for row, client_id in enumerate(client_ids.tolist())]
        replies = self._exchange(client_ids, contents, MessageType.EVALUATE, round_index)
        splits = self.federation.evaluation_splits
        scores: dict[str, list[ClientScores]] = {split: [] for split in splits}
        for client_id in client_ids.tolist():
            reply = replies.get(client_id)
            checked = None
            if reply is not None:
                try:
                    checked = protocol.check_evaluation_reply(reply.content, self._score_expectations(client_id))
                except Exception as err:  # a node's reply is untrusted input: drop it, never crash
                    self._drop(round_index, client_id, f"invalid evaluation rejected ({_reason(err)})",
                               "invalid_reply")
            for split, parts in scores.items():
                parts.append(checked[split] if checked else protocol.missing_scores())
        return {split: ClientScores.concat(parts) for split, parts in scores.items()}

    def _score_expectations(self, client_id: int) -> dict[str, protocol.ScoreExpectation]:
        fed = self.federation
        return {split: protocol.ScoreExpectation(
            int(getattr(fed, split).counts[client_id]),
            1 if fed.task == "classification" else math.prod(getattr(fed, split).y.shape[1:]), fed.task)
            for split in fed.evaluation_splits}


@dataclass(frozen=True)
class PendingWork:
    """A training message submitted to a node and not yet answered."""

    client: int
    node: int
    round_index: int
    sent_at: float  #: time.monotonic() when it was pushed
    deadline: float  #: time.monotonic() after which the reply no longer counts


#: seconds between two looks at the SuperLink for replies to submitted training
POLL_SECONDS = 0.2


class PartialCohortError(RunStoppedError):
    """Fewer training replies arrived than ``flower.min_replies``: the run stops, its checkpoint kept."""


#: summary.json fields only the Flower engine writes
FLOWER_FIELDS = ("dropped_clients", "drop_counts", "refused_nodes", "missed_rounds", "readmitted", "resumed_at",
                 "trainings_sent")
#: the kinds of drop counted in summary.json
DROP_KINDS = ("no_node", "error", "timeout", "invalid_reply")


def _reason(err: Exception) -> str:
    """One printable line of at most 200 characters naming what was wrong with a reply."""
    from graphfed.config import printable

    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return printable(text if isinstance(err, protocol.InvalidReply) else f"{type(err).__name__}: {text}")[:200]
