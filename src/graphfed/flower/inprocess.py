"""An in-process Flower ``Grid``: routes messages straight to a ``ClientApp`` in this process.

For tests and debugging of the Flower path without Ray or network processes. Each node has a random id
(like real SuperNodes), its own ``Context`` with ``partition-id`` and a ``state-dir`` for its client's state
(``state_dir``, default a temporary folder the grid owns). Nodes can be made to fail (error reply), vanish (no
reply), lie (``tamper``: rewrite its replies) or be restarted under a new node id (``restart``) to exercise the
server. A node can be stopped (``stop``: it keeps its messages unanswered, like a SIGSTOPped SuperNode) and
continued (``go_on``: it answers what it holds whose time to live has not run out, then what comes).
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

SERVER_NODE_ID = 0


class InProcessGrid(Grid):
    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: dict[str, str | int | float | bool],
                 seed: int = 0, state_dir: str | Path | None = None) -> None:
        # A real ServerApp process has its task identity set by Flower's runtime; Message() needs it.
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SERVER_NODE_ID, 1
        self.client_app = client_app
        if state_dir is None:
            self._own_state_dir = tempfile.TemporaryDirectory(prefix="graphfed-nodes-")
            state_dir = self._own_state_dir.name
        self.state_dir = str(state_dir)
        self._ids = random.Random(seed)
        self.run_config = dict(run_config)
        self.num_nodes = num_nodes
        self.contexts: dict[int, Context] = {}
        for partition_id in range(num_nodes):
            node = self._new_id()
            self.contexts[node] = self._context(partition_id, node)
        self.failing: set[int] = set()  # nodes that answer train/evaluate messages with an error
        self.silent: set[int] = set()  # nodes that never answer (crashed or disconnected)
        self.answers_left: dict[int, int] = {}  # node -> messages it still answers before it goes silent
        #: node -> a function that rewrites its replies' content (a lying node: forged metrics, wrong shapes...)
        self.tamper: dict[int, Callable[[RecordDict, Message], RecordDict]] = {}
        self._replies: dict[str, Message] = {}
        self._run: Run | None = None
        self.sent: list[Message] = []
        self.stopped: dict[int, list[tuple[str, Message]]] = {}  # stopped node -> the messages it holds
        #: called with each message before it is delivered (tests stop and continue nodes from it)
        self.on_push: Callable[[Message], None] | None = None

    def _new_id(self) -> int:
        return self._ids.randrange(1, 2**62)

    def _context(self, partition_id: int, node: int) -> Context:
        config = {"partition-id": partition_id, "num-partitions": self.num_nodes, "state-dir": self.state_dir}
        return Context(run_id=1, node_id=node, node_config=config, state=RecordDict(),
                       run_config=dict(self.run_config))

    def node_of_partition(self, partition_id: int) -> int:
        return next(node for node, ctx in self.contexts.items() if ctx.node_config["partition-id"] == partition_id)

    def restart(self, node: int) -> int:
        """The node's process dies and a new SuperNode with the same partition id connects: a new node id, a fresh
        context, the same disk. Returns the new node id."""
        partition_id = int(self.contexts.pop(node).node_config["partition-id"])
        new_node = self._new_id()
        self.contexts[new_node] = self._context(partition_id, new_node)
        return new_node

    def stop(self, node: int) -> None:
        self.stopped.setdefault(node, [])

    def go_on(self, node: int) -> None:
        now = time.time()
        for message_id, message in self.stopped.pop(node, []):
            if message.metadata.created_at + message.metadata.ttl >= now:  # an expired message is never delivered
                self._deliver(message_id, message)

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        if self._run is None:
            raise RuntimeError("no run set")
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for number, message in enumerate(messages, start=len(self.sent)):
            self.sent.append(message)
            message_id = f"m{number}"
            message.metadata.__dict__["_message_id"] = message_id  # as the SuperLink's grid does: replies name it
            ids.append(message_id)
            if self.on_push is not None:
                self.on_push(message)
            node = message.metadata.dst_node_id
            if node in self.stopped:
                self.stopped[node].append((message_id, message))
                continue
            self._deliver(message_id, message)
        return ids

    def _deliver(self, message_id: str, message: Message) -> None:
        node = message.metadata.dst_node_id
        if node in self.answers_left:
            self.answers_left[node] -= 1
            if self.answers_left[node] < 0:
                self.silent.add(node)
        if node in self.silent or node not in self.contexts:
            return
        if node in self.failing and message.metadata.message_type != MessageType.QUERY:
            self._replies[message_id] = Message(Error(code=0, reason=f"node {node} failed"), reply_to=message)
            return
        try:
            reply = self.client_app(message, self.contexts[node])
            if node in self.tamper and not reply.has_error():
                reply = Message(self.tamper[node](reply.content, message), reply_to=message)
            self._replies[message_id] = reply
        except Exception as err:  # a real SuperNode turns ClientApp exceptions into error replies
            self._replies[message_id] = Message(Error(code=0, reason=repr(err)), reply_to=message)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(mid) for mid in message_ids if mid in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
