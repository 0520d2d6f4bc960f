"""What a round reports of its clients' replies, as Flower's strategies report it: the
round's train metrics (:func:`train_metrics`), the mean of every metric the used replies
report (:func:`client_means`, Flower's default ``train_metrics_aggr_fn``) and the
federated evaluation's mean (:func:`evaluate_mean`).  Which replies are used is
:mod:`strategies.replies`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from flwr.app import Message, MetricRecord, RecordDict

from fedsys import protocol as proto
from fedsys.validation import ClientUpdate
from strategies.replies import Verdict

#: Flower's ``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn``: the replies' contents
#: and the weight's key -> the round's metrics
MetricsAggrFn = Callable[[list[RecordDict], str], MetricRecord]


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


def reply_metrics(update: ClientUpdate) -> dict[str, float]:
    """What a step of one reply (a chain's hop) reports of it by default: its metrics as
    they are, its ``partition-id`` aside (the mean of one value, which :func:`client_means`
    would move by a rounding)."""
    return {k: v for k, v in update.metrics.items() if k != proto.PARTITION_ID}


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
    good = [r for r in replies if not r.has_error() and proto.metric_records(r.content)]
    rows = [m for m in (proto.metrics_of(r.content) for r in good)
            if math.isfinite(m.get(w, math.nan)) and m[w] >= 0]
    if not rows or sum(r[w] for r in rows) <= 0:
        return None
    return weighted_means(rows, [r[w] for r in rows], (w,))


def client_metrics(verdict: Verdict, aggr_fn: MetricsAggrFn | None, weighted_by_key: str,
                   skip: Iterable[str]) -> tuple[dict[str, float], list[str]]:
    """A round's client train metrics, as Flower's strategies report them: ``aggr_fn``
    (Flower's ``train_metrics_aggr_fn``) on the used replies' contents, each node's first,
    else the mean of every metric all used replies report, weighted by their examples
    (:func:`client_means`, ``skip`` left out).  Numbers only (a round record holds numbers):
    also the names of the non-scalar metrics ``aggr_fn`` returned, left out."""
    updates = verdict.updates
    if aggr_fn is None:
        return client_means(updates, skip), []
    if not updates:
        return {}, []
    used = {u.node_id for u in updates}
    contents: dict[int, RecordDict] = {}
    for r in verdict.replies:
        instr = verdict.sent.get(r.metadata.reply_to_message_id)
        node = instr.metadata.dst_node_id if instr is not None else r.metadata.src_node_id
        if node in used and r.has_content():
            contents.setdefault(node, r.content)
    got: Mapping[str, Any] = aggr_fn(list(contents.values()), weighted_by_key) or {}
    out = {k: float(v) for k, v in got.items()
           if isinstance(v, int | float) and not isinstance(v, bool)}
    return out, sorted(set(got) - set(out))


def add_client_metrics(record: dict[str, Any], verdict: Verdict, aggr_fn: MetricsAggrFn | None,
                       weighted_by_key: str, train_loss_key: str, own: Iterable[str] = ()
                       ) -> tuple[list[str], list[str]]:
    """Put a round's client metrics (:func:`client_metrics`) into ``record``, but where one
    shares a name with the record's own bookkeeping or with ``own``; the names left out:
    ``(non-scalar ones aggr_fn returned, clashing ones)``.  The clients' training loss and
    work, which the round reports from the replies, are ``aggr_fn``'s where it gives them
    (as on Flower's strategies, whose train metrics are what that function returns)."""
    theirs, dropped = client_metrics(verdict, aggr_fn, weighted_by_key,
                                     (weighted_by_key, train_loss_key, proto.TRAINED_EXAMPLES))
    taken = (set(record) | set(own)) - {train_loss_key, proto.TRAINED_EXAMPLES}
    record.update({k: v for k, v in theirs.items() if k not in taken})
    return dropped, sorted(k for k in theirs if k in taken)


def evaluate_metrics(replies: list[Message], aggr_fn: MetricsAggrFn | None, weighted_by_key: str
                     ) -> tuple[MetricRecord | None, bool]:
    """A round's federated evaluation metrics, as Flower's strategies report them:
    ``aggr_fn`` (Flower's ``evaluate_metrics_aggr_fn``) on the replies' contents (error
    replies left out), else :func:`evaluate_mean`; also whether usable replies gave no
    mean (none holds the weight)."""
    good = [r.content for r in replies if not r.has_error() and r.has_content()]
    if aggr_fn is not None:
        return (aggr_fn(good, weighted_by_key) if good else None), False
    mean = evaluate_mean(replies, weighted_by_key)
    return (None if mean is None else proto.metric_record(mean)), mean is None and bool(good)


__all__ = ["MetricsAggrFn", "add_client_metrics", "client_means", "client_metrics", "evaluate_mean",
           "evaluate_metrics", "reply_metrics", "train_metrics", "weighted_means"]
