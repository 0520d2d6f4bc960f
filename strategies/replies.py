"""What a strategy accepts of its nodes' replies and what it reads from them: the
:class:`ReplyPolicy` (refusals of train replies, with reasons), the round's train metrics
(:func:`train_metrics`) and the federated evaluation's mean (:func:`evaluate_mean`).

Checks of one reply alone (its shape, dtypes, finite values, a claimed weight) are
:mod:`fedsys.validation`'s; this module applies them to one exchange's replies, adds what
needs the exchange or the method (a node's second reply, a partition-id another node
holds, a metric the method cannot work without) and logs every refusal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from logging import ERROR, INFO, WARNING
from typing import Any

from flwr.app import Message
from flwr.supercore import log

from fedsys import protocol as proto
from fedsys import validation
from fedsys.params import distance
from fedsys.validation import ClientUpdate, Rejection
from strategies.exchange import Exchange
from strategies.nodes import Known

#: How many accepted update norms a round with fewer than three replies is measured against.
EARLIER = 10

#: ``tell(key, level, msg, *args)``: log ``msg`` once per ``key`` (the strategy's ``tell_once``).
Tell = Callable[..., None]


@dataclass(frozen=True)
class ReplyPolicy:
    """Which train replies a strategy uses (its keyword arguments of the same names).

    Attributes
    ----------
    method : str
        The method's name, in refusals (``fedcda``).
    weighted_by_key, train_loss_key : str
        The reply metrics holding an update's weight and its training loss.
    max_examples_ratio : float
        Bound on a claimed weight (:func:`fedsys.validation.weight_refusals`).
    max_update_ratio : float
        Bound on an update's norm (:func:`fedsys.validation.norm_refusals`).
    max_weight_share : float
        Cap on one reply's share of an example-weighted mean
        (:func:`fedsys.validation.capped_claims`).
    required : Mapping[str, tuple[str, str]]
        Reply metrics the method cannot work without: metric -> (the keyword naming it,
        why the method needs it).
    tell : Tell
        Logs a message once per key.
    earlier : list of float
        The update norms accepted in the last :data:`EARLIER` rounds or hops, the
        yardstick of a round with fewer than three replies (part of the strategy's state).
    arrays_key : str
        The name the strategy sends its model under (Flower's ``arrayrecord_key``), read
        first in a reply (:func:`fedsys.protocol.model_key`).
    private : bool
        Under differential privacy (set by the DP wrapper, :mod:`strategies.dp`): no bound
        compares one client's reply with another's, so that no client's update decides
        another's inclusion (``max-update-ratio``, the median rule of
        ``max-examples-ratio`` and ``max-weight-share`` are off; clipping bounds every
        update and every update counts 1), and no update norm is kept in :attr:`earlier`.
    """

    method: str
    weighted_by_key: str
    train_loss_key: str
    max_examples_ratio: float
    max_update_ratio: float
    max_weight_share: float
    required: Mapping[str, tuple[str, str]]
    tell: Tell
    earlier: list[float] = field(default_factory=list)
    arrays_key: str = proto.ARRAYS
    private: bool = False

    def read_keys(self) -> set[str]:
        """The reply metrics the strategy reads: a reply whose value for one of them is not
        a finite number is refused; any other metric is the client's own affair."""
        return {self.weighted_by_key, self.train_loss_key, proto.PARTITION_ID,
                proto.TRAINED_EXAMPLES, *self.required}

    def check(self, update: ClientUpdate, label: str) -> str | None:
        """Why a well-formed update cannot be used by the method (``None``: it can): it
        lacks a :attr:`required` metric (said once, as an ERROR naming the key and the
        keyword that names it)."""
        for key, (keyword, why) in self.required.items():
            if key not in update.metrics:
                self.tell(f"needs-{key}", ERROR, "[%s] %s needs the metric '%s' in every train "
                          "reply (%s; keyword %s=%r names it); replies without it are refused",
                          label, self.method, key, why, keyword, key)
                return f"reply metrics lack '{key}', which {self.method} needs"
        return None

    def bound_updates(self, ok: list[ClientUpdate], ex: Exchange, label: str
                      ) -> tuple[list[ClientUpdate], list[Rejection]]:
        """Refuse the updates far longer than the others' and cut the claims that would
        take most of a weighted mean (:func:`fedsys.validation.norm_refusals`,
        :func:`fedsys.validation.capped_claims`); remember the accepted norms.  Under
        :attr:`private`, none of this (the DP wrapper clips every update instead)."""
        if self.private:
            return ok, []
        norms = {u.node_id: distance(u.params, ref) for u in ok
                 if (ref := ex.payloads.get(u.node_id)) is not None}
        far = validation.norm_refusals(norms, self.earlier[-EARLIER:], self.max_update_ratio)
        bad = [Rejection(u.node_id, u.partition_id, far[u.node_id]) for u in ok if u.node_id in far]
        ok = [u for u in ok if u.node_id not in far]
        self.earlier.extend(validation.history_norms(  # only measured norms (issue 65 E)
            norms, {u.node_id for u in ok}, self.earlier[-EARLIER:], self.max_update_ratio))
        del self.earlier[:-EARLIER]
        cut = validation.capped_claims({u.node_id: float(u.num_examples) for u in ok},
                                       self.max_weight_share)
        if cut and self.max_weight_share * len(ok) < 1:
            self.tell("share-below-1/n", WARNING, "[%s] max-weight-share %g is below 1/%d: no "
                      "weighting of a round of %d replies holds it; such a round counts every "
                      "reply as its smallest claim (equal weights, the closest there is)", label,
                      self.max_weight_share, len(ok), len(ok))
        for u in ok:
            if u.node_id in cut:
                log(WARNING, "[%s] client %d (node %d) claims num-examples %d, more than "
                    "max-weight-share %g of the round's weighted mean: counted as %d",
                    label, u.partition_id, u.node_id, u.num_examples,
                    self.max_weight_share, math.floor(cut[u.node_id]))
        return [replace(u, num_examples=math.floor(cut[u.node_id])) if u.node_id in cut else u
                for u in ok], bad

    def sort(self, replies: Iterable[Message], ex: Exchange, known: Known, label: str
             ) -> tuple[list[ClientUpdate], list[Rejection]]:
        """Split the replies to ``ex`` into usable updates (by partition) and logged
        refusals.

        A reply's ``partition-id``, where it reports one, is the node's key from then on
        (the first report is kept in ``known``); a reply reporting another than the
        node's first, or one another connected node holds, is refused, as are a node's
        second reply, a reply :meth:`check` finds unusable, a claimed weight out of bounds
        (:func:`fedsys.validation.weight_refusals`) and a missing reply.
        """
        replies = list(replies)
        sent = ex.sent()
        ok: list[ClientUpdate] = []
        bad: list[Rejection] = []
        seen: set[int] = set()
        for r in replies:
            res = validation.parse_train_reply(
                r, sent, ex.expected, ex.reference(r, sent), reported=known.partition_ids,
                weighted_by_key=self.weighted_by_key, read=self.read_keys(),
                arrays_key=self.arrays_key,
            )
            if isinstance(res, ClientUpdate) and proto.PARTITION_ID in res.metrics:
                known.partition_ids.setdefault(res.node_id, res.partition_id)  # its first report
            if isinstance(res, ClientUpdate) and res.local:
                self.tell("local-arrays", INFO, "[%s] train replies leave out arrays %s%s (kept "
                          "on the clients, as in Flower's FedBN how-to): the server keeps the "
                          "values it sent for them", label, list(res.local[:5]),
                          " ..." if len(res.local) > 5 else "")
            if isinstance(res, ClientUpdate) and res.node_id in seen:
                res = Rejection(res.node_id, res.partition_id, "duplicate reply")
            if isinstance(res, ClientUpdate) and (why := self.check(res, label)) is not None:
                res = Rejection(res.node_id, res.partition_id, why)
            if isinstance(res, Rejection) and res.reason == validation.lacks(self.weighted_by_key):
                w = self.weighted_by_key
                self.tell(f"needs-{w}", ERROR, "[%s] train replies lack the metric '%s' that "
                          "updates are weighted by (keyword weighted_by_key=%r names it); "
                          "replies without it are refused", label, w, w)
            (ok if isinstance(res, ClientUpdate) else bad).append(res)  # type: ignore[arg-type]
            seen.add(res.node_id)
        refused = validation.weight_refusals({u.node_id: float(u.num_examples) for u in ok},
                                             known.num_examples,
                                             0.0 if self.private else self.max_examples_ratio)
        bad += [Rejection(u.node_id, u.partition_id, refused[u.node_id]) for u in ok
                if u.node_id in refused]
        ok = [u for u in ok if u.node_id not in refused]
        ok, far = self.bound_updates(ok, ex, label)
        bad += far
        for node in validation.missing_nodes(sent, replies):
            bad.append(Rejection(node, ex.expected.get(node, -1), "no reply before round-timeout"))
        for rj in bad:
            log(WARNING, "[%s] rejected reply of client %d (node %d): %s",
                label, rj.partition_id, rj.node_id, rj.reason)
        return sorted(ok, key=lambda u: u.partition_id), bad


def why_refused(rejections: Iterable[Rejection]) -> str:
    """The distinct reasons of ``rejections``, most frequent first, with their counts
    (``"3x reply metrics lack 'train_loss', which fedcda needs"``)."""
    counts: dict[str, int] = {}
    for rj in rejections:
        counts[rj.reason] = counts.get(rj.reason, 0) + 1
    if not counts:
        return "no node was sent an instruction"
    top = sorted(counts.items(), key=lambda kv: -kv[1])
    text = "; ".join(f"{n}x {why}" for why, n in top[:3])
    return text + (f"; {len(top) - 3} other reasons" if len(top) > 3 else "")


def train_metrics(updates: list[ClientUpdate], rejected: int, train_loss_key: str
                  ) -> dict[str, float | int]:
    """A round's train metrics: ``clients-ok``, ``clients-rejected``, the example-weighted
    mean of ``train_loss_key`` over the updates reporting one, and the examples trained
    (``trained-examples``) where any update reports them."""
    out: dict[str, float | int] = {"clients-ok": len(updates), "clients-rejected": rejected}
    with_loss = [u for u in updates if train_loss_key in u.metrics]
    n = sum(u.num_examples for u in with_loss)
    if with_loss and n > 0:
        out[train_loss_key] = sum(u.metrics[train_loss_key] * u.num_examples for u in with_loss) / n
    if any(proto.TRAINED_EXAMPLES in u.metrics for u in updates):
        out[proto.TRAINED_EXAMPLES] = sum(u.metrics.get(proto.TRAINED_EXAMPLES, 0) for u in updates)
    return out


def weighted_means(rows: Sequence[Mapping[str, float]], weights: Sequence[float], skip: Iterable[str]
                   ) -> dict[str, float]:
    """Flower's default aggregation of client metrics (its ``aggregate_metricrecords``):
    the mean of every metric that all ``rows`` report as a finite number, weighted by
    ``weights``, but the keys in ``skip`` and the ``partition-id`` (empty when there is no
    row or no weight)."""
    left = set(skip) | {proto.PARTITION_ID}
    n = sum(weights)
    if not rows or n <= 0:
        return {}
    keys = [k for k in rows[0] if k not in left
            and all(math.isfinite(r.get(k, math.nan)) for r in rows)]
    return {k: sum(r[k] * w for r, w in zip(rows, weights, strict=True)) / n for k in keys}


def client_means(updates: list[ClientUpdate], skip: Iterable[str]) -> dict[str, float]:
    """What Flower's strategies report of their clients' train metrics by default: each
    metric all ``updates`` report, weighted by the update's examples (:func:`weighted_means`;
    ``skip``: the weight itself, what the round reports otherwise).  Flower's tutorial adds
    a metric to the train reply ("training_time") and finds it "aggregated automatically"."""
    return weighted_means([u.metrics for u in updates],
                          [float(u.num_examples) for u in updates], skip)


def evaluate_mean(replies: Iterable[Message], weighted_by_key: str) -> dict[str, Any] | None:
    """Mean of the clients' evaluation metrics weighted by ``weighted_by_key``, as Flower's
    FedAvg: every finite metric all usable replies report, but the weight and
    ``partition-id`` (``None``: no usable reply)."""
    w = weighted_by_key
    good = [r for r in replies if not r.has_error() and r.content.metric_records]
    rows = [m for m in (proto.metrics_of(r.content) for r in good)
            if math.isfinite(m.get(w, math.nan)) and m[w] >= 0]
    if not rows or sum(r[w] for r in rows) <= 0:
        return None
    return weighted_means(rows, [r[w] for r in rows], (w,))


__all__ = ["ReplyPolicy", "Tell", "client_means", "evaluate_mean", "train_metrics", "weighted_means",
           "why_refused"]
