"""The node directory: who a strategy's nodes are, and which of them a round samples.

Node ids are Flower's (random, new when a node restarts); a node is *keyed* by the
``partition-id`` it declared first (its QUERY answer or its first train reply), else by
its node id.  Sampling draws over the sorted keys with a seeded generator, so where every
partition-id is known the same seed picks the same clients whatever node ids Flower
assigned.  What the nodes declared is a :class:`Known` that the strategies of one run
share (:meth:`NodeDirectory.share`): the second strategy asks no node again.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.serverapp import Grid
from flwr.supercore import log

from fedsys import protocol as proto
from fedsys import transport
from fedsys.seeding import derive_seed

#: Seeds a round's training sample (:meth:`NodeDirectory.sample`'s default ``tag``).
SAMPLE_TAG = 0x5EED
#: Seeds a round's evaluation sample.
EVAL_TAG = 0xE7A1


class NodesUnavailableError(RuntimeError):
    """Fewer than ``min_available_nodes`` nodes connected within ``node_wait_timeout``."""


@dataclass
class Known:
    """What a run's nodes declared; a node's declaration (its ``node_config``) does not
    change while the run lasts."""

    #: The partition-id each node reported first; a node not in here is keyed by its id.
    partition_ids: dict[int, int] = field(default_factory=dict)
    #: The training size each node declared for its partition (its query answer).
    num_examples: dict[int, int] = field(default_factory=dict)
    #: Nodes sent a QUERY already, answered or not: none is asked twice.
    asked: set[int] = field(default_factory=set)


@dataclass
class NodeDirectory:
    """Identities and sampling of a strategy's nodes (see the module docstring).

    Parameters
    ----------
    seed : int
        Seeds the draws (with the round and a tag).
    fraction_train, min_train_nodes, min_available_nodes : float, int, int
        Flower's sampling rule where a round names no count (:meth:`sample`).
    wait_timeout : float
        Seconds :meth:`wait` waits for the nodes it wants.
    query : bool
        Ask every node not asked before for its partition before sampling (one QUERY).
    num_partitions : int, optional
        The partitions the nodes should hold; a node declaring another count is logged.
    tell : callable
        Logs a message once per key (the strategy's ``tell_once``).
    known : Known
        What the nodes declared (a run's strategies share one: :meth:`share`).
    secret_draws : bool
        Draw each round's training sample from the operating system's entropy instead of
        the seed (set by the DP wrapper, :mod:`strategies.dp`: amplification by sampling
        holds only while the sample is secret, and the seed is in the run's config).
    """

    seed: int = 0
    fraction_train: float = 1.0
    min_train_nodes: int = 2
    min_available_nodes: int = 2
    wait_timeout: float = 120.0
    query: bool = False
    num_partitions: int | None = None
    tell: Callable[..., None] = field(default=lambda *a: None, repr=False)
    known: Known = field(default_factory=Known)
    secret_draws: bool = False
    #: The last draw's nodes and keys, for the next while the nodes and what they declared
    #: stay the same (a federation of 100,000 nodes is not keyed again each round).
    keyed: tuple[list[int], int, dict[int, int], list[int]] | None = field(
        default=None, repr=False, compare=False)
    #: How many keys (partitions, else nodes) the last training sample was drawn from: the
    #: pool whose rate m / pool a DP accountant must use (issue 75 item 7a: with 10 of 100
    #: sites connected every round takes the same 10, whatever num-clients says).
    pool: int = field(default=0, compare=False)

    def share(self, known: Known) -> None:
        """Keep what the nodes declare in ``known`` from now on (a run's strategies share
        one, one after another: each node is asked once per run)."""
        self.known = known
        self.keyed = None

    def key_of(self, node_id: int) -> int:
        """The key a node is known by: the partition-id it reported first, else its id."""
        return self.known.partition_ids.get(node_id, node_id)

    def wait(self, grid: Grid, want: int, label: str) -> list[int]:
        """Connected node ids once ``want`` are there.

        After ``wait_timeout`` seconds it goes on with the nodes that are connected if
        there are at least ``min_available_nodes``; otherwise
        :class:`NodesUnavailableError`.  It never waits forever.
        """
        need = min(self.min_available_nodes, want)
        t0 = time.monotonic()
        while len(ids := sorted(grid.get_node_ids())) < want:
            if time.monotonic() - t0 > self.wait_timeout:
                if len(ids) >= need:
                    log(WARNING, "[%s] %d of %d wanted nodes connected after %.0f s; going on",
                        label, len(ids), want, self.wait_timeout)
                    return ids
                raise NodesUnavailableError(
                    f"only {len(ids)} of {need} required nodes connected after "
                    f"{self.wait_timeout:.0f} s (node-wait-timeout, min-available-clients)")
            time.sleep(0.2)
        return ids

    def refresh(self, grid: Grid, node_ids: Iterable[int], label: str,
                timeout: float, poll_interval: float) -> dict[int, int]:
        """``{node_id: key}`` of the nodes ``node_ids`` (:meth:`key_of`).

        Forgets the nodes that left (a restarted node comes back with a new id and
        reports its partition again).  With ``query`` it first asks every node not asked
        before for its partition-id through one QUERY round (``timeout``); a node that
        does not answer it (a ClientApp written from Flower's documentation has no query
        handler) is keyed by its node id until a train reply reports one.
        """
        k = self.known
        live = set(node_ids)
        k.partition_ids = {n: p for n, p in k.partition_ids.items() if n in live}
        new = sorted(live - set(k.partition_ids) - k.asked) if self.query else []
        if new:
            k.asked.update(new)
            replies, sent = transport.send_and_receive(
                grid, [proto.query_message(n) for n in new], timeout, poll_interval)
            for r in replies:
                instr = sent.get(r.metadata.reply_to_message_id)
                if instr is not None and not r.has_error() and proto.metric_records(r.content):
                    self._declared(instr.metadata.dst_node_id, proto.metrics_of(r.content))
            anon = [n for n in new if n not in k.partition_ids]
            if anon:
                self.tell("anonymous", INFO, "[%s] %d node(s) did not answer the partition-id "
                          "query (no query handler, or no '%s' in the answer); they are keyed "
                          "by their node ids until a train reply reports one", label,
                          len(anon), proto.PARTITION_ID)
        return {n: self.key_of(n) for n in sorted(live)}

    def _declared(self, node: int, rec: dict[str, Any]) -> None:
        """Keep what ``node``'s query answer ``rec`` declared."""
        if proto.PARTITION_ID in rec:
            self.known.partition_ids[node] = int(rec[proto.PARTITION_ID])
        if proto.NUM_EXAMPLES in rec:
            self.known.num_examples[node] = int(rec[proto.NUM_EXAMPLES])
        nparts = int(rec.get(proto.NUM_PARTITIONS, self.num_partitions or 0))
        if self.num_partitions is not None and nparts != self.num_partitions:
            log(WARNING, "node %d holds partition %s of %d, but num-clients is %d: the "
                "federation and the config disagree (flwr run: --federation-config "
                "num-supernodes=%d)", node, rec.get(proto.PARTITION_ID), nparts,
                self.num_partitions, self.num_partitions)

    def sample(self, grid: Grid, server_round: int, k: int | None, label: str, timeout: float,
               poll_interval: float, tag: int = SAMPLE_TAG) -> dict[int, int]:
        """Pick ``k`` nodes (``{node_id: key}``) with a seeded generator.

        ``k=None`` takes Flower's rule: ``max(int(fraction_train * connected),
        min_train_nodes)`` once ``min_available_nodes`` are connected.  The draw is over
        the nodes' sorted keys with ``default_rng(seed, round, tag)`` (with
        :attr:`secret_draws`, a training sample from 128 bits of the OS's entropy).
        A training draw keeps the size of the pool it drew from in :attr:`pool`.
        """
        if k is None:
            connected = len(self.wait(grid, self.min_available_nodes, label))
            k = min(connected, max(int(connected * self.fraction_train), self.min_train_nodes))
        ids = self.wait(grid, k, label)
        if (last := self.keyed) is not None and last[0] == ids and last[1] == len(
                self.known.partition_ids):  # no node came or left, none reported anew
            by_pid, pids = last[2], last[3]
        else:
            pid_of = self.refresh(grid, ids, label, timeout, poll_interval)
            by_pid = {p: n for n, p in sorted(pid_of.items())}
            pids = sorted(by_pid)
            self.keyed = (ids, len(self.known.partition_ids), by_pid, pids)
        if len(pids) < k:
            log(WARNING, "round %d: %d nodes known, %d wanted", server_round, len(pids), k)
        if tag == SAMPLE_TAG:
            self.pool = len(pids)
        secret = self.secret_draws and tag == SAMPLE_TAG
        rng = np.random.default_rng(secrets.randbits(128) if secret
                                    else derive_seed(self.seed, server_round, tag))
        # draw positions, not values: node ids (the keys of nodes that declare no
        # partition-id) do not fit numpy's int64; the same draw as choosing from ``pids``
        picks = rng.choice(len(pids), size=min(k, len(pids)), replace=False)
        chosen = sorted(pids[int(i)] for i in picks)
        return {by_pid[p]: int(p) for p in chosen}


class Reports(Mapping[int, int]):
    """Node -> the partition-id it reported first, and who reported each partition: a
    claim is checked against the others' reports in constant time, not by a pass over a
    federation's every node (100,000 nodes, 100 replies a round)."""

    def __init__(self, first: Mapping[int, int] | None = None) -> None:
        self.first: dict[int, int] = {}
        self.holders: dict[int, list[int]] = {}  # partition -> its reporters, in order
        for node, pid in (first or {}).items():
            self.add(node, pid)

    def add(self, node: int, pid: int) -> None:
        """``node`` reports ``pid``; only its first report counts."""
        if node not in self.first:
            self.first[node] = pid
            self.holders.setdefault(pid, []).append(node)

    def holder(self, pid: int, other_than: int) -> int | None:
        """The first node but ``other_than`` that reported ``pid``, or None."""
        return next((m for m in self.holders.get(pid, ()) if m != other_than), None)

    def __getitem__(self, node: int) -> int:
        return self.first[node]

    def __iter__(self) -> Iterator[int]:
        return iter(self.first)

    def __len__(self) -> int:
        return len(self.first)



__all__ = ["EVAL_TAG", "SAMPLE_TAG", "Known", "NodeDirectory", "NodesUnavailableError", "Reports"]
