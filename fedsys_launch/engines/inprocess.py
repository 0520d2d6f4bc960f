"""fedsys's own simulation engine (``engine: inprocess``): the ServerApp and every ClientApp
in this process, no Ray actor and no SuperLink between them.

:class:`InProcessGrid` is a Flower :class:`~flwr.serverapp.Grid` (the interface Flower's
``InMemoryGrid`` implements) that hands each pushed message to the unchanged ClientApp
(``ClientApp.__call__(message, context)``) at once and keeps its reply for the next pull.
What goes in and out are real :class:`~flwr.app.Message` objects with the metadata Flower's
simulation gives them (message ids, ``reply_to_message_id``, source and destination nodes,
``created_at``, ``ttl``, ``delivered_at``), and a ClientApp that raises gives the error reply
Flower's simulation gives (``CLIENT_APP_RAISED_EXCEPTION``, the node's context left as it
was; the reason is the one Flower's runtime writes, ``<class '...ClientAppException'>:<'...
Message: <the error>'>``, without the actor's traceback that Ray's wrapper puts in it).  Each node has Flower's :class:`~flwr.app.Context`: its node id,
``node_config`` ``{partition-id, num-partitions}``, the run config and a ``state`` that
persists across rounds.

What a Ray actor keeps to itself is kept apart here too: each ClientApp call gets copies of
the message and the context (records copied, their arrays shared: an ``Array`` holds
immutable bytes), runs with the clients' torch thread count and global random generators
(:class:`fedsys_launch.engines.actor_isolation.ClientSide`) and with the node's task identity (Flower 1.42
makes a ``Message`` only inside a task: :func:`fedsys_launch.flower_patches.task_identity`); the
ServerApp's are put back after.

Not reproduced: clients do not run in parallel (one message at a time, in push order);
``client-num-cpus`` and ``client-num-gpus`` reserve nothing and the clients see this
process's devices (Ray hides the GPUs from a client given none); every message is answered
while it is pushed, so ``round-timeout`` refuses no reply and ``send_and_receive`` returns
at once; node ids are drawn from a fixed seed (:func:`node_ids`), not at random; no node
goes offline (``NODE_UNAVAILABLE`` never comes); no telemetry, no Ray log prefixes.
"""

from __future__ import annotations

import functools
import os
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from logging import DEBUG, ERROR, INFO, WARNING
from typing import Any, Protocol, cast
from uuid import uuid4

import numpy as np
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.app.error import Error
from flwr.clientapp.client_app import ClientAppException
from flwr.common.constant import (
    MESSAGE_TTL_TOLERANCE,
    NUM_PARTITIONS_KEY,
    PARTITION_ID_KEY,
    SUPERLINK_NODE_ID,
    ErrorCode,
)
from flwr.proto.node_pb2 import NodeInfo
from flwr.server.superlink.linkstate.utils import (
    create_message_error_unavailable_ins_message,
    create_message_error_unavailable_res_message,
    message_ttl_has_expired,
)
from flwr.server.utils.validator import validate_message
from flwr.serverapp import Grid
from flwr.supercore import log
from flwr.supercore.constant import NOOP_FEDERATION_ID, NodeStatus
from flwr.supercore.date import now
from flwr.supercore.run import Run

from fedsys.config import RunConfig
from fedsys_launch.engines.actor_isolation import (
    ClientSide,
    actor_threads,
    copy_message,
    copy_records,
)
from fedsys_launch.flower_patches import set_message_id, task_identity

#: Seeds the node ids (Flower's simulation draws them from ``os.urandom``): the same ids in
#: every run.  fedsys keys its nodes by partition-id, so no number depends on them.
NODE_ID_SEED = 0x1D5
#: The run id of every in-process run (Flower's simulation draws one at random).
RUN_ID = 0x5EED_F1A5
#: The task id of the ServerApp and of the ClientApp calls (Flower's simulation sets 1).
TASK_ID = 1

ClientAppFn = Callable[[Message, Context], Message]


class Batcher(Protocol):
    """A ClientApp's train handler in parts, so that a round's train instructions are
    trained together (:class:`fedsys_launch.engines.batch_training.BatchTraining` for the fedsys ClientApp)."""

    def prepare(self, msg: Message, context: Context) -> Any:
        """``msg`` read on its node, or None: the ClientApp handles it itself."""

    def key(self, prepared: Any) -> Any:
        """What the prepared calls trained together share."""

    def train(self, group: list[Any]) -> Sequence[Any]:
        """The outcome of each prepared call of one key, trained together."""

    def reply(self, prepared: Any, trained: Any, context: Context) -> Message:
        """The node's reply (raises what the ClientApp would): a new message that the
        batcher keeps no hold of (the server takes it as it is, not a copy)."""


def node_ids(n: int, seed: int = NODE_ID_SEED) -> list[int]:
    """``n`` distinct unsigned 64-bit node ids, neither 0 nor the SuperLink's, from ``seed``."""
    rng = np.random.default_rng(seed)
    out: dict[int, None] = {}
    while len(out) < n:
        v = int(rng.integers(0, 2**64, dtype=np.uint64))
        if v not in (0, SUPERLINK_NODE_ID):
            out[v] = None
    return list(out)


class NodeContexts(MutableMapping[int, Context]):
    """Each node's Context as Flower's simulation makes it, by node id: partition ``i`` for
    the ``i``-th id, ``num-partitions`` their count, an empty state, the run config.

    Made when first asked for, and kept only once set (a node whose call succeeded): a
    federation of 100,000 nodes of which a round samples 100 holds the contexts of the
    nodes that have trained, not 100,000 copies of the run config.  Every node's
    ``run_config`` is one dict, never handed to a ClientApp (its call gets a copy,
    :meth:`InProcessGrid.context_copy`).
    """

    def __init__(self, ids: Iterable[int], run_id: int, run_config: Mapping[str, Any]) -> None:
        self.ids = list(ids)
        self.index = {n: i for i, n in enumerate(self.ids)}
        self.run_id = run_id
        self.run_config = dict(run_config)
        self.made: dict[int, Context] = {}

    def __getitem__(self, node: int) -> Context:
        if (ctx := self.made.get(node)) is not None:
            return ctx
        i = self.index[node]
        return Context(run_id=self.run_id, node_id=node,
                       node_config={PARTITION_ID_KEY: i, NUM_PARTITIONS_KEY: len(self.ids)},
                       state=RecordDict(), run_config=self.run_config)

    def __setitem__(self, node: int, ctx: Context) -> None:
        if node not in self.index:
            raise KeyError(node)
        self.made[node] = ctx

    def __delitem__(self, node: int) -> None:
        self.made.pop(node, None)

    def __contains__(self, node: object) -> bool:
        return node in self.index

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


def node_contexts(ids: Iterable[int], run_id: int, run_config: Mapping[str, Any]) -> NodeContexts:
    """Each node's Context as Flower's simulation makes it (:class:`NodeContexts`)."""
    return NodeContexts(ids, run_id, run_config)


def _answer(batcher: Batcher, prepared: Any, trained: Any, context: Context) -> Message:
    """``batcher``'s reply to a prepared call whose training gave ``trained`` (an error
    raised by training the group raised again)."""
    if isinstance(trained, Exception):
        raise trained
    return batcher.reply(prepared, trained, context)


def error_reply(instruction: Message, exc: Exception) -> Message:
    """The reply Flower's simulation makes when handling ``instruction`` raised ``exc``
    (``vce_api.worker``): the ClientApp's error (``ClientAppException``) has code
    ``CLIENT_APP_RAISED_EXCEPTION``, any other ``UNKNOWN``.  (Through Ray, ``exc`` is Ray's
    ``RayTaskError(ClientAppException)``, whose text adds the actor's traceback.)"""
    code = (ErrorCode.CLIENT_APP_RAISED_EXCEPTION if isinstance(exc, ClientAppException)
            else ErrorCode.UNKNOWN)
    return Message(Error(code=code, reason=str(type(exc)) + ":<'" + str(exc) + "'>"),
                   reply_to=instruction)


def reply_refusal(reply: object, instruction: Message) -> str | None:
    """Why Flower's LinkState would not store ``reply`` to ``instruction``
    (``store_message_res``), or None."""
    if not isinstance(reply, Message):
        return f"the ClientApp returned {type(reply).__name__}, not a Message"
    errors = validate_message(reply, is_reply_message=True)
    if errors:
        return "; ".join(errors)
    got, ins = reply.metadata, instruction.metadata
    if got.reply_to_message_id != ins.message_id:
        return f"it replies to message {got.reply_to_message_id!r}, not {ins.message_id!r}"
    if got.src_node_id != ins.dst_node_id or got.run_id != ins.run_id:
        return "its source node or run is not the instruction's destination or run"
    if got.ttl - (ins.created_at + ins.ttl - got.created_at) > MESSAGE_TTL_TOLERANCE:
        return "its TTL outlives the instruction's"
    return None


class InProcessGrid(Grid):
    """A Flower Grid whose nodes are ClientApp calls in this process.

    Parameters
    ----------
    client_app : callable
        The ClientApp (``app(message, context) -> Message``), called once per message.
    contexts : Mapping[int, Context]
        Each node's Context by node id (:func:`node_contexts`); a node's becomes the one
        its last successful call left.
    run : Run
        The run (its id is every message's ``run_id``).
    client_side : ClientSide, optional
        The clients' process state (default: one thread, fresh generators).
    batcher : Batcher, optional
        ``client_app``'s train handler in parts: the train instructions of one push are
        trained together (default: none, one message at a time).
    """

    def __init__(self, client_app: ClientAppFn, contexts: Mapping[int, Context], run: Run,
                 client_side: ClientSide | None = None, batcher: Batcher | None = None) -> None:
        self.client_app = client_app
        self.batcher = batcher
        self.contexts: MutableMapping[int, Context] = (
            contexts if isinstance(contexts, NodeContexts) else dict(contexts))
        # what each node's run config was at the start (a ClientApp may not change it):
        # NodeContexts' one dict, or each given context's
        self.shared_run_config = contexts.run_config if isinstance(contexts, NodeContexts) else None
        self.node_run_config = {} if self.shared_run_config is not None else {
            n: dict(c.run_config) for n, c in self.contexts.items()}
        self.client_side = client_side or ClientSide(1)
        self.instructions: dict[str, Message] = {}
        self.replies: dict[str, Message] = {}  # by the id of the instruction answered
        self.current_run = run

    def set_run(self, run: Run) -> None:
        """Set the run (as Flower's grids, a :class:`Run` only)."""
        if not isinstance(run, Run):
            raise TypeError(f"`run` must be an instance of Run, got {type(run).__name__}")
        self.current_run = run

    @property
    def run(self) -> Run:
        """A copy of the run."""
        return Run(**vars(self.current_run))

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        """A new instruction (Flower's deprecated helper; use ``Message(...)``)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        """Every node's id (all are always connected)."""
        return list(self.contexts)

    def get_nodes(self) -> list[NodeInfo]:
        """Every node's :class:`NodeInfo` (its id; online)."""
        return [NodeInfo(node_id=n, status=NodeStatus.ONLINE) for n in self.contexts]

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Give each message an id and deliver it: its ClientApp runs now, its reply waits
        for :meth:`pull_messages`.  A message Flower's LinkState refuses (expired, unknown
        node, not an instruction) is logged and gets ``""`` in place of an id (order kept).

        Raises
        ------
        ValueError
            A message with no TTL, or pushed before (Flower's ``Invalid message``).
        """
        ids: list[str] = []
        accepted: list[Message] = []
        for msg in messages:
            set_message_id(msg, str(uuid4()))
            meta = msg.metadata
            if not (meta.reply_to_message_id == "" and meta.ttl > 0 and meta.delivered_at == ""):
                raise ValueError(f"Invalid message: {msg}")
            if why := self.refusal(msg):
                log(ERROR, "Message to node %s not stored: %s", meta.dst_node_id, why)
                ids.append("")
                continue
            self.instructions[meta.message_id] = msg
            ids.append(meta.message_id)
            accepted.append(msg)
        self.deliver_all(accepted)
        return ids

    def refusal(self, msg: Message) -> str | None:
        """Why Flower's LinkState would not store the instruction ``msg``, or None."""
        if errors := validate_message(msg, is_reply_message=False):
            return "; ".join(errors)
        if msg.metadata.run_id != self.current_run.run_id:
            return f"invalid run ID {msg.metadata.run_id}"
        if msg.metadata.dst_node_id not in self.contexts:
            return f"invalid destination node ID {msg.metadata.dst_node_id}"
        return None

    def deliver_all(self, instructions: list[Message]) -> None:
        """Deliver ``instructions``: one at a time (:meth:`deliver`), but for the train
        instructions the :class:`Batcher` takes, which are read on their nodes, trained
        together where their jobs agree, and answered, in push order within each part."""
        batcher = self.batcher
        if batcher is None:
            for msg in instructions:
                self.deliver(msg)
            return
        with self.client_side.entered():  # once for them all: only clients run within
            self.deliver_batched(batcher, instructions)

    def deliver_batched(self, batcher: Batcher, instructions: list[Message]) -> None:
        """:meth:`deliver_all`'s work where a :class:`Batcher` takes train instructions."""
        prepared: list[tuple[Message, Message, Context, Any]] = []
        for msg in instructions:
            if msg.metadata.message_type != MessageType.TRAIN:
                self.deliver(msg)
                continue
            msg.metadata.delivered_at = now().isoformat()
            mine = copy_message(msg)  # the node's, for both halves of its call
            ctx = self.context_copy(mine.metadata.dst_node_id)
            ready = self.guarded(mine, ctx, functools.partial(batcher.prepare, mine, ctx),
                                 commit=False)
            if isinstance(ready, Message):  # reading it failed: the error reply
                self.keep(msg, ready, own=True)
            elif ready is None:  # not batched: the ClientApp itself
                self.deliver(msg)
            else:
                prepared.append((msg, mine, ctx, ready))
        groups: dict[Any, list[int]] = {}
        for i, (_, _, _, ready) in enumerate(prepared):
            groups.setdefault(batcher.key(ready), []).append(i)
        trained: dict[int, Any] = {}
        for members in groups.values():
            log(DEBUG, "%d clients trained together", len(members))
            with self.client_side.entered():
                try:
                    outcome = batcher.train([prepared[i][3] for i in members])
                except Exception as exc:  # each node of the group gets it as its error
                    outcome = [exc] * len(members)
            trained.update(zip(members, outcome, strict=True))
        for i, (msg, mine, ctx, ready) in enumerate(prepared):
            self.keep(msg, self.guarded(mine, ctx, functools.partial(
                _answer, batcher, ready, trained[i], ctx)), own=True)

    def deliver(self, instruction: Message) -> None:
        """Run the ClientApp on ``instruction`` and keep its reply (one Flower's LinkState
        would refuse is logged and dropped: the instruction then gets no reply)."""
        instruction.metadata.delivered_at = now().isoformat()
        self.keep(instruction, self.call(copy_message(instruction)))

    def keep(self, instruction: Message, reply: object, own: bool = False) -> None:
        """Keep ``reply`` to ``instruction`` for :meth:`pull_messages` (one Flower's
        LinkState would refuse is logged and dropped).  The server gets a copy, as Ray's
        pickling gives it, unless ``own``: a reply that nothing else holds (the error
        replies made here, a :class:`Batcher`'s)."""
        if isinstance(reply, Message):
            set_message_id(reply, str(uuid4()))
        if why := reply_refusal(reply, instruction):
            log(ERROR, "Reply of node %s not stored: %s", instruction.metadata.dst_node_id, why)
            return
        assert isinstance(reply, Message)
        self.replies[instruction.metadata.message_id] = reply if own else copy_message(reply)

    def call(self, msg: Message) -> object:
        """The ClientApp's reply to ``msg`` (its error reply when it raises), with copies of
        the node's context: a call that succeeds leaves the node its context, one that
        raises leaves the node's as it was (as Flower's simulation does)."""
        ctx = self.context_copy(msg.metadata.dst_node_id)
        return self.guarded(msg, ctx, lambda: self.client_app(msg, ctx))

    def context_copy(self, node: int) -> Context:
        """A copy of ``node``'s context that the ClientApp may change."""
        ctx = self.contexts[node]
        return Context(run_id=ctx.run_id, node_id=ctx.node_id, node_config=dict(ctx.node_config),
                       state=copy_records(ctx.state), run_config=dict(ctx.run_config))

    def guarded(self, msg: Message, mine: Context, work: Callable[[], Any],
                commit: bool = True) -> Any:
        """``work()`` for ``msg``'s node, with its context copy ``mine``, as a ClientApp call
        runs: the clients' process state and the node's task identity in place, an error
        made the error reply Flower's simulation gives (returned), the run config checked
        unchanged; where it succeeds and ``commit``, ``mine`` becomes the node's context."""
        node = msg.metadata.dst_node_id
        try:
            with self.client_side.entered(), task_identity(TASK_ID, mine.run_id, node):
                try:
                    out = work()
                except Exception as exc:  # as Flower's Ray actor wraps it
                    raise ClientAppException(str(exc)) from exc
            first = self.shared_run_config
            if mine.run_config != (first if first is not None else self.node_run_config[node]):
                raise ValueError("The `run_config` field of the `Context` object cannot be "
                                 f"modified (run_id: {mine.run_id}).")
        except Exception as exc:  # reported as an error reply, as Flower's simulation does
            log(ERROR, exc)
            log(ERROR, traceback.format_exc())
            return error_reply(msg, exc)
        if commit:
            self.contexts[node] = mine
        return out

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """The replies to ``message_ids`` not pulled before, as Flower's LinkState gives
        them: ``MESSAGE_UNAVAILABLE`` for an id unknown, pulled already or expired,
        ``REPLY_MESSAGE_UNAVAILABLE`` for an expired reply; nothing for an instruction
        whose reply was refused.  The instructions answered are forgotten."""
        out: list[Message] = []
        current = now().timestamp()
        for mid in dict.fromkeys(message_ids):
            ins = self.instructions.get(mid)
            if ins is None or message_ttl_has_expired(ins.metadata, current):
                out.append(create_message_error_unavailable_ins_message(mid, self.current_run.run_id))
                continue
            if (res := self.replies.get(mid)) is None:
                continue
            if message_ttl_has_expired(res.metadata, current):
                res = create_message_error_unavailable_res_message(ins.metadata, "msg_unavail")
            res.metadata.delivered_at = now().isoformat()
            out.append(res)
        for res in out:
            self.instructions.pop(res.metadata.reply_to_message_id, None)
            self.replies.pop(res.metadata.reply_to_message_id, None)
        return out

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> list[Message]:
        """Push ``messages`` and pull their replies.  Every message is answered while it is
        pushed, so this returns at once whatever ``timeout`` says (a reply refused never
        comes: waiting for it would change nothing)."""
        ids = [i for i in self.push_messages(messages) if i]
        return self.pull_messages(ids)


def make_grid(cfg: RunConfig, client_app: ClientAppFn, environ: Mapping[str, str],
              batcher: Batcher | None = None) -> InProcessGrid:
    """The Grid of ``cfg``'s run: ``num-clients`` nodes with the run config of
    ``cfg`` (what Flower's simulation reads back from the app's ``pyproject.toml``)."""
    run = Run.create_empty(run_id=RUN_ID)
    run.primary_task_id = TASK_ID
    run.federation_id = NOOP_FEDERATION_ID
    contexts = node_contexts(node_ids(cfg.num_clients), RUN_ID, cfg.to_dict())
    return InProcessGrid(client_app, contexts, run,
                         ClientSide(actor_threads(cfg.client_num_cpus, environ)), batcher)


def simulate_inprocess(cfg: RunConfig, verbose: bool = False,
                       client_app: object | None = None) -> None:
    """Run ``cfg`` with ``num-clients`` in-process nodes (:class:`InProcessGrid`).

    As :func:`fedsys_launch.engines.simulation.simulate`: ``client_app`` replaces the fedsys ClientApp,
    both apps admit the run config under the policy of ``cfg`` itself, and the ServerApp
    does not log the results table.  The ServerApp runs in this thread (Ctrl-C and SIGTERM
    stop it where it is).
    """
    from flwr.supercore.logger import update_console_handler

    from fedsys import confine
    from fedsys_launch.apps import server_app as server_module
    from fedsys_launch.apps.client_app import FedsysClientApp, make_app
    from fedsys_launch.engines.batch_training import BatchTraining

    if verbose:
        update_console_handler(level=DEBUG, timestamps=True, colored=True)
    policy = confine.own_run_policy(cfg)
    app = make_app(policy) if client_app is None else client_app
    own = app if isinstance(app, FedsysClientApp) else None  # its training can be batched
    batched = cfg.batch_clients != "false" and own is not None
    workers = None
    if batched and cfg.ray_address:
        from fedsys_launch.engines.ray_training_workers import RayWorkers

        workers = RayWorkers(cfg.ray_address, cfg.device)
    elif cfg.ray_address:
        log(WARNING, "fedsys: ray-address %s is not used: on the in-process engine only "
            "clients trained together go to the cluster, and here none are (%s)",
            cfg.ray_address, "batch-clients is false" if cfg.batch_clients == "false"
            else "a ClientApp of your own")
    try:
        grid = make_grid(cfg, cast(ClientAppFn, app), os.environ,
                         BatchTraining(cfg.batch_clients, workers=workers, admission=own.admission)
                         if own is not None and batched else None)
        log(INFO, "fedsys: in-process engine, %d nodes, %s", cfg.num_clients,
            f"a round's clients trained together where their jobs agree (batch-clients: "
            f"{cfg.batch_clients})" if batched else "one message at a time")
        context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                          run_config=dict(cfg.to_dict()))
        with task_identity(TASK_ID, RUN_ID, SUPERLINK_NODE_ID):
            server_module.make_app(policy, log_table=False)(grid, context)
    finally:
        if workers is not None:
            workers.close()


__all__ = ["RUN_ID", "TASK_ID", "InProcessGrid", "NodeContexts", "error_reply", "make_grid", "node_contexts",
           "node_ids", "reply_refusal", "simulate_inprocess"]
