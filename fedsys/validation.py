"""Whether a client's reply is used: a train reply becomes a :class:`ClientUpdate`, or a
:class:`Rejection` that names the node, its client and the reason (wrong records, shapes,
dtypes, NaN or Inf, a partition-id it may not claim, a count it cannot have); a round's
example counts are bounded (:func:`weight_refusals`) and its silent nodes named
(:func:`missing_nodes`).  The keys are :mod:`fedsys.protocol`'s.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Message

from fedsys.params import Params, check_update
from fedsys.protocol import (
    ARRAYS,
    MODEL_PREFIX,
    NUM_EXAMPLES,
    PARTITION_ID,
    TRAINED_EXAMPLES,
    extra_models,
    from_record,
    metrics_of,
    model_key,
)


@dataclass
class ClientUpdate:
    """A validated train reply.

    ``partition_id`` is what the node declared (its reply's ``partition-id`` or its
    answer to the query); a node that declares none is keyed by its node id.
    """

    node_id: int
    partition_id: int
    params: Params
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    models: dict[str, Params] = field(default_factory=dict)
    #: arrays of the model the reply left out (kept on the client, as FedBN does): the
    #: update holds the values it was sent for them
    local: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rejection:
    """A reply that was not used, and why."""

    node_id: int
    partition_id: int
    reason: str


def lacks(key: str) -> str:
    """The refusal of a reply without the metric ``key``."""
    return f"reply metrics lack '{key}'"


def parse_train_reply(
    reply: Message,
    sent: Mapping[str, Message],
    expected_pid: Mapping[int, int],
    reference: Params | None,
    reported: Mapping[int, int] | None = None,
    weighted_by_key: str = NUM_EXAMPLES,
    read: Collection[str] | None = None,
    arrays_key: str = ARRAYS,
) -> ClientUpdate | Rejection:
    """Validate one train reply against the model the node was sent.

    A reply's model may leave arrays out (layers its client keeps, as Flower's FedBN
    how-to does with batch normalisation): the update holds the values it was sent for
    them (:attr:`ClientUpdate.local`); a model holding none of the arrays is refused.
    The reply's records as Flower's strategies take them: one model ArrayRecord
    (``arrays_key``, else the one whatever its name: :func:`fedsys.protocol.model_key`)
    beside any named extra models (``model.<name>``), one MetricRecord whatever its name,
    and any ConfigRecords, which are the client's own and not read.

    ``expected_pid`` maps node ids to the keys they were sampled under this round
    (partition-ids, or node ids for nodes that reported none).  ``reported`` maps
    node ids to the partition-id each reported first (``None``: ``expected_pid``
    holds them): a reply echoing another ``partition-id`` than its node's first, or
    one that another node reported, is refused; a node's first report is its key; a
    reply echoing none is keyed as sampled.  ``reference`` is the model whose keys,
    shapes and dtypes the update must match (the instruction's own arrays when
    ``None``).  ``weighted_by_key`` names the example count (Flower's keyword).
    ``read`` lists the metrics the strategy reads: a value of one of them that is
    not a finite number refuses the reply; any other metric that is not a finite
    number is left out of :attr:`ClientUpdate.metrics` (``None``: every metric is
    read).
    """
    instr = sent.get(reply.metadata.reply_to_message_id)
    node = instr.metadata.dst_node_id if instr is not None else reply.metadata.src_node_id
    pid = expected_pid.get(node, -1)
    if reported is None:
        reported = {n: p for n, p in expected_pid.items() if n == node}
    if instr is None and sent:
        return Rejection(node, pid, "reply to a message this round did not send")
    if reply.has_error():
        err = reply.error
        return Rejection(node, pid, f"error reply (code {err.code}): {str(err.reason)[-300:]}")
    content = reply.content
    main = model_key(content, arrays_key)
    models_in = [k for k in content.array_records if not k.startswith(MODEL_PREFIX)]
    if main is None and not models_in:
        return Rejection(node, pid, f"reply holds no ArrayRecord '{arrays_key}'")
    odd = [k for k in models_in if k != main]
    if odd:
        return Rejection(node, pid, f"reply holds unexpected ArrayRecord(s) {odd} (expected "
                         f"one model, '{arrays_key}', and named models '{MODEL_PREFIX}<name>')")
    assert main is not None
    if len(content.metric_records) > 1:
        return Rejection(node, pid, f"reply holds more than one MetricRecord "
                         f"{list(content.metric_records)} (expected one, as Flower's "
                         f"strategies)")

    def is_read(k: str) -> bool:
        return read is None or k in read

    for rec in content.metric_records.values():
        typed = [k for k, v in rec.items()
                 if is_read(k) and (not isinstance(v, int | float) or isinstance(v, bool))]
        if typed:
            return Rejection(node, pid, f"metric(s) {typed} are not numbers")
    metrics = {k: v for k, v in metrics_of(content).items() if is_read(k) or np.isfinite(v)}
    w = weighted_by_key
    if w not in metrics:
        held = [k for k, r in content.config_records.items() if w in r]
        if held and not content.metric_records:
            return Rejection(node, pid, f"reply holds no MetricRecord ('{w}' is in ConfigRecord "
                             f"'{held[0]}'; numbers to aggregate travel in a MetricRecord)")
        return Rejection(node, pid, lacks(w))
    n = metrics[w]
    if np.isfinite(n) and n != int(n):
        return Rejection(node, pid, f"{w} is {n:g}, not a whole number")
    if PARTITION_ID in metrics:
        claim = metrics[PARTITION_ID]
        if not np.isfinite(claim) or claim != int(claim):
            return Rejection(node, pid, f"{PARTITION_ID} is {claim:g}, not a whole number")
        first = reported.get(node)
        if first is not None and int(claim) != first:
            return Rejection(node, pid, f"reply echoes {PARTITION_ID} {int(claim)}, expected "
                             f"{first} (the node's first report; a partition does not change)")
        holder = next((m for m, p in reported.items() if p == int(claim) and m != node), None)
        if holder is not None:
            return Rejection(node, pid, f"reply echoes {PARTITION_ID} {int(claim)}, which node "
                             f"{holder} reported")
        pid = int(claim)
    elif node in reported:
        pid = reported[node]
    if not np.isfinite(metrics[w]) or metrics[w] <= 0:
        return Rejection(node, pid, f"{w} is {metrics[w]}")
    try:
        params = from_record(content.array_records[main])
        models = extra_models(content)
    except Exception as exc:
        return Rejection(node, pid, f"arrays cannot be decoded: {exc}")
    sent_key = model_key(instr.content, arrays_key) if instr is not None else None
    if reference is None and instr is not None and sent_key is not None:
        reference = from_record(instr.content.array_records[sent_key])
    local: list[str] = []
    if reference is not None:
        local = [k for k in reference if k not in params]
        if local and len(local) == len(reference):
            return Rejection(node, pid, f"reply's model holds none of the arrays it was sent "
                             f"(it holds {sorted(params)[:3]}, expected {list(reference)[:3]}...)")
        if local:  # layers the client keeps (Flower's FedBN how-to): the values it was sent
            params = {**{k: params[k] if k in params else reference[k].copy() for k in reference},
                      **{k: v for k, v in params.items() if k not in reference}}
        for name, m in [("", params), *models.items()]:
            why = check_update(m, reference)
            if why is not None:
                return Rejection(node, pid, f"model '{name}': {why}" if name else why)
    bad = [k for k, v in metrics.items() if not np.isfinite(v)]
    if bad:
        return Rejection(node, pid, f"metric(s) {bad} are NaN or Inf")
    if metrics.get(TRAINED_EXAMPLES, 0) < 0:  # the work the results compare methods on
        return Rejection(node, pid, f"{TRAINED_EXAMPLES} is {metrics[TRAINED_EXAMPLES]:g}")
    return ClientUpdate(node, pid, params, int(metrics[w]), metrics, models, tuple(local))




def weight_refusals(claims: Mapping[int, float], declared: Mapping[int, int],
                    max_ratio: float) -> dict[int, str]:
    """Replies whose claimed ``num-examples`` would let them take over an aggregate.

    A node that declared its partition's size (its answer to the query) may claim up
    to that.  A node that declared none may claim up to ``max_ratio`` times the median
    of the *other* replies' claims in the round (leave-one-out, so one huge claim cannot
    move its own yardstick; 0 turns this bound off; a round with one reply has none):
    honest partitions can differ in size by far more than any fixed ratio, so the
    declared size is the check, the ratio the fallback.  Returns ``{node: reason}``
    with the numbers.
    """
    import statistics

    out: dict[int, str] = {}
    for node, n in claims.items():
        if node in declared:
            if n > declared[node]:
                out[node] = (f"claims num-examples {n:g}, but its partition holds "
                             f"{declared[node]} (its answer to the query)")
            continue
        others = [v for k, v in claims.items() if k != node]
        if max_ratio > 0 and others:
            med = statistics.median(others)
            if med > 0 and n > max_ratio * med:
                out[node] = (f"claims num-examples {n:g}, {n / med:.3g} times the median "
                             f"{med:g} of the round's other replies (max-examples-ratio "
                             f"{max_ratio:g})")
    return out



def norm_refusals(norms: Mapping[int, float], earlier: Sequence[float],
                  max_ratio: float) -> dict[int, str]:
    """Replies whose update (the returned model minus the model the node was sent) is
    far longer than the others': ``{node: reason}`` with the numbers.

    A node's yardstick is the median update norm of the round's *other* replies when
    there are two or more (leave-one-out, so one huge update cannot move its own
    yardstick: a round of three or more replies), else the median of ``earlier``, the
    norms accepted in the previous rounds or a chain's previous hops (none yet: no
    bound).  A norm above ``max_ratio`` times its yardstick is refused (0: no bound; a
    yardstick of 0 bounds nothing).  A scaled model (x 100) moves the global model by
    about 99 times its own norm; an honest update by a few percent of it.
    """
    import statistics

    out: dict[int, str] = {}
    for node, n in norms.items():
        others = [v for k, v in norms.items() if k != node]
        base = others if len(others) >= 2 else list(earlier)
        if max_ratio <= 0 or not base:
            continue
        med = statistics.median(base)
        if med > 0 and n > max_ratio * med:
            whose = "the round's other replies" if base is others else "the updates before"
            out[node] = (f"update norm {n:.4g}, {n / med:.3g} times the median {med:.4g} of "
                         f"{whose} (max-update-ratio {max_ratio:g})")
    return out


def history_norms(norms: Mapping[int, float], accepted: Collection[int],
                  earlier: Sequence[float], max_ratio: float) -> list[float]:
    """The update norms a round adds to ``earlier``, the history that
    :func:`norm_refusals` measures rounds of one or two replies (and a chain's hops)
    against: the norms of the ``accepted`` replies that were measured against a yardstick
    (the median of two or more others in the round, or of ``earlier``; positive, with the
    bound on), in ``norms``' order.

    A round in which no accepted reply met one (a first round of one or two replies, a
    chain's first hop, the bound off) adds only its smallest accepted norm: an unmeasured
    norm cannot raise the yardstick of the rounds after it (issue 65 item E: a first round
    of norms 1 and 1000 made the next round of one or two replies accept up to 20 x 500.5,
    9000 among them).  An attacker there can only make the yardstick smaller, so its error is a
    refusal logged with the numbers, not a silent acceptance; the next round of three or
    more replies, bounded by each other, refills the history.
    """
    import statistics

    def measured(node: int) -> bool:
        others = [v for k, v in norms.items() if k != node]
        base = others if len(others) >= 2 else list(earlier)
        return max_ratio > 0 and bool(base) and statistics.median(base) > 0

    kept = [(node, n) for node, n in norms.items() if node in accepted]
    bounded = [n for node, n in kept if measured(node)]
    return bounded if bounded or not kept else [min(n for _, n in kept)]


def share_cap_level(claims: Sequence[float], max_share: float) -> float:
    r"""The level :math:`t` to cut claims to so that none is more than ``max_share`` of
    their sum: water-filling, every claim above :math:`t` counted as :math:`t`
    (``inf``: none is above the cap).

    With the claims :math:`c_1 \ge \dots \ge c_n`, :math:`s` = ``max_share`` and the
    :math:`k` largest cut, :math:`t = s R_k / (1 - k s)` with :math:`R_k = \sum_{j>k}
    c_j`, for the smallest :math:`k` with :math:`t \ge c_{k+1}`: every cut claim then has
    exactly the share :math:`s`, the others less, and the cut claims stay the largest.
    The share of a cut claim, :math:`t / (k t + R_k)`, grows with :math:`t`, so a level
    rounded down (whole examples) keeps it at most :math:`s`.  Below :math:`s = 1/n` no
    weighting can hold the cap (the largest share is at least :math:`1/n`): equal
    weights, every claim cut to the smallest, are the best there is.
    """
    desc = sorted(claims, reverse=True)
    n = len(desc)
    if not desc or desc[0] <= max_share * sum(desc):
        return math.inf
    if max_share * n <= 1:
        return desc[-1]
    rest = sum(desc)
    for k in range(1, n):
        rest -= desc[k - 1]
        t = max_share * rest / (1 - k * max_share)
        if t >= desc[k]:
            return t
    return desc[-1]  # not reached: max_share > 1/n has a level with k < n


def capped_claims(claims: Mapping[int, float], max_share: float) -> dict[int, float]:
    """Claimed weights that would give a reply more than ``max_share`` of an
    example-weighted mean, cut: ``{node: its weight after the cut}``.

    The largest claims are cut to one level (:func:`share_cap_level`, water-filling) at
    which each has exactly ``max_share`` of the sum after every cut, so no reply has more,
    for any cap in (0, 1) and from two replies on (12,000 against 600 at 0.5: 600 each).
    A cap below ``1 / n`` cannot hold for ``n`` replies: they are counted equally (every
    claim above the smallest cut to it).  A cut leaves the reply in (an honest large
    client keeps a say) but no claim, true or not, makes one reply more of the mean than
    the cap.  ``max_share`` 0 or 1 (or above): no cap; one reply is the whole mean.
    """
    if not 0 < max_share < 1 or len(claims) < 2:
        return {}
    level = share_cap_level(list(claims.values()), max_share)
    return {node: level for node, n in claims.items() if n > level}


def missing_nodes(sent: Mapping[str, Message], replies: Iterable[Message]) -> list[int]:
    """Nodes whose instruction got no reply at all (timeout)."""
    answered = {r.metadata.reply_to_message_id for r in replies}
    return [m.metadata.dst_node_id for i, m in sent.items() if i not in answered]


__all__ = ["ClientUpdate", "Rejection", "capped_claims", "history_norms", "lacks", "missing_nodes",
           "norm_refusals", "parse_train_reply", "share_cap_level", "weight_refusals"]
