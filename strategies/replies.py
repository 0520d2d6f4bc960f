"""The reply pipeline: whether a strategy uses each train reply of an exchange, judged in
one walk, in the order a reply is judged, its refusals one list (:func:`judge`).

1. **decode** (:func:`decode`): the reply answers an instruction of this exchange, is not
   an error, holds one model ArrayRecord (``arrays_key``, else its one ArrayRecord whatever
   its name: Flower's rule) beside named extra models (``model.<name>``), at most one
   MetricRecord, the metrics the strategy reads as numbers, a whole weight
   (``weighted_by_key``), arrays that decode; its ConfigRecords are the client's own.
2. **identity** (:func:`identify`): a reply's ``partition-id`` must be its node's first
   report and no other node's (the first keys the node from then on); one reporting none
   is keyed as its node was sampled.
3. **shape and values** (:func:`check_values`): a positive weight; the model matches the
   one its node was sent (keys, shapes, dtypes, finite values; arrays left out are layers
   the client keeps, as in Flower's FedBN how-to, and hold the values sent); finite
   metrics; a non-negative ``trained-examples``; then (:func:`screen_reply`) a node's second
   reply and a reply without a metric the method needs (:attr:`ReplyPolicy.required`).
4. **bounds** (:func:`bound`): the round's usable replies against each other and the
   run's earlier ones: a claimed weight beyond its partition's declared size or far above
   the others' (:func:`fedsys.validation.weight_refusals`), an update norm far above the
   others' (:func:`fedsys.validation.norm_refusals`), a claim above ``max_weight_ratio``
   times the median of the others', cut to that (:func:`fedsys.validation.ratio_capped_claims`),
   then, where ``max_weight_share`` is set, a claim that would take more than that share of a
   weighted mean, cut (:func:`fedsys.validation.capped_claims`).
   Under differential privacy none (no client's update decides another's inclusion).
5. **wrappers**: the strategy's :meth:`strategies.wrapper.WrapperChain.screen` (DP clips
   every update and refuses one trained from another model).

The nodes that did not answer close the list.  Each step is a pure function of the reply
(or the round's replies) and the round (:class:`RoundView`); :func:`judge` returns one
:class:`Verdict`, also of what the run learnt (first partition-ids, update norms), which
the strategy keeps; :func:`tell` logs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from logging import ERROR, INFO, WARNING

import numpy as np
from flwr.app import Message
from flwr.supercore import log
from numpy.typing import NDArray

from fedsys import protocol as proto
from fedsys import validation
from fedsys.params import Params, check_update, distance_to, flatten
from fedsys.validation import ClientUpdate, Rejection, lacks
from strategies.exchange import Exchange
from strategies.nodes import Known, Reports

#: How many accepted update norms a round with fewer than three replies is measured against.
EARLIER = 10

#: ``tell(key, level, msg, *args)``: log ``msg`` once per ``key`` (the strategy's ``tell_once``).
Tell = Callable[..., None]
#: The wrappers' step: the round's usable updates and node -> the model it was sent ->
#: the updates as the strategy uses them, and those refused there.
Screen = Callable[[list[ClientUpdate], Mapping[int, Params]],
                  tuple[list[ClientUpdate], list[Rejection]]]


@dataclass(frozen=True)
class ReplyPolicy:
    """Which train replies a strategy uses: its keyword arguments of the same names
    (:class:`strategies.base.FedsysStrategy`), ``method`` its name in refusals, ``required``
    the reply metrics it cannot work without (metric -> the keyword naming it, why it needs
    it), ``tell`` logs once per key, ``arrays_key`` is Flower's ``arrayrecord_key``.
    ``private``: under differential privacy (set by the DP wrapper, :mod:`strategies.dp`) no
    bound compares one client's reply with another's, so that no client's update decides
    another's inclusion (``max-update-ratio``, the median rule of ``max-examples-ratio``,
    ``max-weight-ratio`` and ``max-weight-share`` are off; clipping bounds every update and
    every update counts 1), and no update norm joins the history.  ``max_weight_ratio``:
    a claim above that many times the median of the round's other claims counts as that
    (0: no such bound)."""

    method: str
    weighted_by_key: str
    train_loss_key: str
    max_examples_ratio: float
    max_update_ratio: float
    max_weight_share: float
    required: Mapping[str, tuple[str, str]]
    tell: Tell
    arrays_key: str = proto.ARRAYS
    private: bool = False
    max_weight_ratio: float = 0.0

    def read_keys(self) -> set[str]:
        """The reply metrics the strategy reads: a reply whose value for one of them is not
        a finite number is refused; any other metric is the client's own affair."""
        return {self.weighted_by_key, self.train_loss_key, proto.PARTITION_ID,
                proto.TRAINED_EXAMPLES, *self.required}

    def needs(self, key: str) -> str:
        """The refusal of a reply without ``key``, a metric the method needs."""
        return f"{lacks(key)}, which {self.method} needs"


@dataclass(frozen=True)
class RoundView:
    """What one exchange's replies are judged against."""

    #: message id -> instruction, as accepted by the SuperLink
    sent: Mapping[str, Message]
    #: node id -> the key it was sampled under (its partition-id, or its node id)
    expected: Mapping[int, int]
    #: node id -> the model it was sent (what its update must match)
    payloads: Mapping[int, Params]
    #: node id -> the partition-id it reported first, before this exchange
    reported: Mapping[int, int] = field(default_factory=dict)
    #: node id -> its partition's declared size (its answer to the query)
    declared: Mapping[int, int] = field(default_factory=dict)
    #: the update norms accepted in the last :data:`EARLIER` rounds or hops
    earlier: tuple[float, ...] = ()

    @classmethod
    def of(cls, ex: Exchange, known: Known, earlier: Sequence[float] = ()) -> RoundView:
        """The view of the exchange ``ex`` with what the run knows of its nodes."""
        return cls(ex.sent(), dict(ex.expected), dict(ex.payloads), dict(known.partition_ids),
                   dict(known.num_examples), tuple(earlier[-EARLIER:]))


@dataclass(frozen=True)
class Decoded:
    """A reply's records, decoded (step 1): who it came to and what it holds."""

    node: int
    #: the key its node was sampled under (-1: none)
    sampled: int
    instruction: Message | None
    params: Params
    models: dict[str, Params]
    metrics: dict[str, float]


@dataclass(frozen=True)
class Verdict:
    """One exchange's replies, judged: the updates the strategy uses (by partition), the
    refusals (one list, in the order of the steps, the nodes that did not answer last),
    and what the run learnt."""

    updates: list[ClientUpdate] = field(default_factory=list)
    refused: list[Rejection] = field(default_factory=list)
    #: the replies as received
    replies: list[Message] = field(default_factory=list)
    #: message id -> instruction, the exchange's (to tell which reply answered which)
    sent: Mapping[str, Message] = field(default_factory=dict)
    #: node -> partition-id, the first reports of nodes that had reported none
    reported: dict[int, int] = field(default_factory=dict)
    #: update norms for the history of :attr:`RoundView.earlier`
    norms: list[float] = field(default_factory=list)
    #: node -> (its claimed weight, the weight it counts as), for the claims cut
    cut: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: node -> why its claim was cut (the bound and its numbers), for the claims cut
    cut_why: dict[int, str] = field(default_factory=dict)
    #: how many updates the share cap weighed (the bounds step's usable ones)
    capped_over: int = 0


def decode(reply: Message, rnd: RoundView, policy: ReplyPolicy) -> Decoded | Rejection:
    """Step 1: the reply's records, or why they cannot be read (see the module docstring)."""
    instr = rnd.sent.get(reply.metadata.reply_to_message_id)
    node = instr.metadata.dst_node_id if instr is not None else reply.metadata.src_node_id
    pid = rnd.expected.get(node, -1)
    if instr is None and rnd.sent:
        return Rejection(node, pid, "reply to a message this round did not send")
    if reply.has_error():
        err = reply.error
        return Rejection(node, pid, f"error reply (code {err.code}): {str(err.reason)[-300:]}")
    content = reply.content
    key = policy.arrays_key
    main = proto.model_key(content, key)
    models_in = [k for k in proto.array_records(content) if not k.startswith(proto.MODEL_PREFIX)]
    if main is None and not models_in:
        return Rejection(node, pid, f"reply holds no ArrayRecord '{key}'")
    odd = [k for k in models_in if k != main]
    if odd:
        return Rejection(node, pid, f"reply holds unexpected ArrayRecord(s) {odd} (expected "
                         f"one model, '{key}', and named models '{proto.MODEL_PREFIX}<name>')")
    assert main is not None
    if len(proto.metric_records(content)) > 1:
        return Rejection(node, pid, f"reply holds more than one MetricRecord "
                         f"{list(proto.metric_records(content))} (expected one, as Flower's "
                         f"strategies)")
    read = policy.read_keys()
    for rec in proto.metric_records(content).values():
        typed = [k for k, v in rec.items()
                 if k in read and (not isinstance(v, int | float) or isinstance(v, bool))]
        if typed:
            return Rejection(node, pid, f"metric(s) {typed} are not numbers")
    metrics = {k: v for k, v in proto.metrics_of(content).items() if k in read or np.isfinite(v)}
    w = policy.weighted_by_key
    if w not in metrics:
        held = [k for k, r in proto.config_records(content).items() if w in r]
        if held and not proto.metric_records(content):
            return Rejection(node, pid, f"reply holds no MetricRecord ('{w}' is in ConfigRecord "
                             f"'{held[0]}'; numbers to aggregate travel in a MetricRecord)")
        return Rejection(node, pid, lacks(w))
    n = metrics[w]
    if np.isfinite(n) and n != int(n):
        return Rejection(node, pid, f"{w} is {n:g}, not a whole number")
    try:
        params = proto.from_record(proto.array_records(content)[main])
        models = proto.extra_models(content)
    except Exception as exc:
        return Rejection(node, pid, f"arrays cannot be decoded: {exc}")
    return Decoded(node, pid, instr, params, models, metrics)


def identify(d: Decoded, reported: Mapping[int, int]) -> int | Rejection:
    """Step 2: the partition the reply is keyed by, or why its claim is refused
    (``reported``: node -> its first report, this exchange's earlier replies included)."""
    if proto.PARTITION_ID not in d.metrics:
        return reported.get(d.node, d.sampled)
    claim = d.metrics[proto.PARTITION_ID]
    if not np.isfinite(claim) or claim != int(claim):
        return Rejection(d.node, d.sampled, f"{proto.PARTITION_ID} is {claim:g}, not a whole number")
    first = reported.get(d.node)
    if first is not None and int(claim) != first:
        return Rejection(d.node, d.sampled, f"reply echoes {proto.PARTITION_ID} {int(claim)}, "
                         f"expected {first} (the node's first report; a partition does not change)")
    holder = (reported if isinstance(reported, Reports) else Reports(reported)).holder(int(claim), d.node)
    if holder is not None:
        return Rejection(d.node, d.sampled, f"reply echoes {proto.PARTITION_ID} {int(claim)}, "
                         f"which node {holder} reported")
    return int(claim)


def reference_of(d: Decoded, rnd: RoundView, arrays_key: str) -> Params | None:
    """The model the reply's update must match: what its node was sent (the
    instruction's own arrays where the exchange holds none)."""
    if d.instruction is None:
        return None
    ref = rnd.payloads.get(d.instruction.metadata.dst_node_id)
    if ref is None and (key := proto.model_key(d.instruction.content, arrays_key)) is not None:
        ref = proto.from_record(proto.array_records(d.instruction.content)[key])
    return ref


def check_values(d: Decoded, pid: int, reference: Params | None, weighted_by_key: str
                 ) -> ClientUpdate | Rejection:
    """Step 3: the update, its model completed with the arrays its client keeps, or why
    its weight, model or metrics cannot be used."""
    w = weighted_by_key
    if not np.isfinite(d.metrics[w]) or d.metrics[w] <= 0:
        return Rejection(d.node, pid, f"{w} is {d.metrics[w]}")
    params = d.params
    local: list[str] = []
    if reference is not None:
        local = [k for k in reference if k not in params]
        if local and len(local) == len(reference):
            return Rejection(d.node, pid, f"reply's model holds none of the arrays it was sent "
                             f"(it holds {sorted(params)[:3]}, expected {list(reference)[:3]}...)")
        if local:  # layers the client keeps (Flower's FedBN how-to): the values it was sent
            params = {**{k: params[k] if k in params else reference[k].copy() for k in reference},
                      **{k: v for k, v in params.items() if k not in reference}}
        for name, m in [("", params), *d.models.items()]:
            why = check_update(m, reference)
            if why is not None:
                return Rejection(d.node, pid, f"model '{name}': {why}" if name else why)
    bad = [k for k, v in d.metrics.items() if not np.isfinite(v)]
    if bad:
        return Rejection(d.node, pid, f"metric(s) {bad} are NaN or Inf")
    if d.metrics.get(proto.TRAINED_EXAMPLES, 0) < 0:  # the work the results compare methods on
        return Rejection(d.node, pid, f"{proto.TRAINED_EXAMPLES} is "
                         f"{d.metrics[proto.TRAINED_EXAMPLES]:g}")
    return ClientUpdate(d.node, pid, params, int(d.metrics[w]), dict(d.metrics), d.models,
                        tuple(local))


def screen_reply(u: ClientUpdate, seen: Collection[int], policy: ReplyPolicy
                 ) -> ClientUpdate | Rejection:
    """The rest of step 3: a node's second reply (``seen``: the nodes whose replies came
    before) and a reply without a metric the method needs are refused."""
    if u.node_id in seen:
        return Rejection(u.node_id, u.partition_id, "duplicate reply")
    for key in policy.required:
        if key not in u.metrics:
            return Rejection(u.node_id, u.partition_id, policy.needs(key))
    return u


def judge_reply(reply: Message, rnd: RoundView, policy: ReplyPolicy,
                reported: Mapping[int, int], seen: Collection[int] = ()
                ) -> tuple[ClientUpdate | Rejection, int | None]:
    """Steps 1 to 3 for one reply: the update or its refusal, and the partition-id it
    reports where its model and values hold (a node's first report keys it, even where
    the reply is then refused as its second or for a metric the method needs)."""
    d = decode(reply, rnd, policy)
    if isinstance(d, Rejection):
        return d, None
    pid = identify(d, reported)
    if isinstance(pid, Rejection):
        return pid, None
    u = check_values(d, pid, reference_of(d, rnd, policy.arrays_key), policy.weighted_by_key)
    if isinstance(u, Rejection):
        return u, None
    return screen_reply(u, seen, policy), (pid if proto.PARTITION_ID in u.metrics else None)


def bound(updates: list[ClientUpdate], rnd: RoundView, policy: ReplyPolicy) -> Verdict:
    """Step 4: the round's usable updates against each other and the run's earlier ones
    (see the module docstring): the updates kept, the refusals, the norms for the history
    (:func:`fedsys.validation.history_norms`) and the claims cut; under
    :attr:`ReplyPolicy.private`, only a node's declared partition size bounds a claim."""
    claims = {u.node_id: float(u.num_examples) for u in updates}
    heavy = validation.weight_refusals(claims, rnd.declared,
                                       0.0 if policy.private else policy.max_examples_ratio)
    refused = [Rejection(u.node_id, u.partition_id, heavy[u.node_id]) for u in updates
               if u.node_id in heavy]
    ok = [u for u in updates if u.node_id not in heavy]
    if policy.private:
        return Verdict(ok, refused)
    sent: dict[int, NDArray[np.float64]] = {}  # each model sent, flattened once (most share one)
    norms = {u.node_id: distance_to(u.params, sent[id(ref)] if id(ref) in sent
                                    else sent.setdefault(id(ref), flatten(ref)))
             for u in ok if (ref := rnd.payloads.get(u.node_id)) is not None}
    far = validation.norm_refusals(norms, rnd.earlier, policy.max_update_ratio)
    refused += [Rejection(u.node_id, u.partition_id, far[u.node_id]) for u in ok if u.node_id in far]
    ok = [u for u in ok if u.node_id not in far]
    keep = validation.history_norms(  # only measured norms (issue 65 E)
        norms, {u.node_id for u in ok}, rnd.earlier, policy.max_update_ratio)
    cuts, why = capped_weights({u.node_id: u.num_examples for u in ok}, policy)
    ok = [replace(u, num_examples=cuts[u.node_id][1]) if u.node_id in cuts else u for u in ok]
    return Verdict(ok, refused, norms=keep, cut=cuts, cut_why=why)


def capped_weights(claims: Mapping[int, int], policy: ReplyPolicy
                   ) -> tuple[dict[int, tuple[int, int]], dict[int, str]]:
    """The claims cut by the weight bounds: ``{node: (claimed, counted)}`` and ``{node:
    why}``.  First a claim above ``max_weight_ratio`` times the median of the round's other
    claims counts as that (:func:`fedsys.validation.ratio_capped_claims`), then, where
    ``max_weight_share`` is set, the claims that would still give a reply more than that
    share of the mean are cut to one level (:func:`fedsys.validation.capped_claims`)."""
    r = policy.max_weight_ratio
    levels = validation.ratio_capped_claims({k: float(n) for k, n in claims.items()}, r)
    after = {k: max(1, math.floor(levels[k])) if k in levels else n for k, n in claims.items()}
    by_share = validation.capped_claims({k: float(n) for k, n in after.items()},
                                        policy.max_weight_share)
    counted = {**after, **{k: math.floor(v) for k, v in by_share.items()}}
    cuts = {k: (n, counted[k]) for k, n in claims.items() if counted[k] != n}
    why = {k: (f"more than max-weight-share {policy.max_weight_share:g} of the round's "
               f"weighted mean" if k in by_share else
               f"more than max-weight-ratio {r:g} times the median {levels[k] / r:g} of the "
               f"round's other claims") for k in cuts}
    return cuts, why


# ------------------------------------------------------------------ the walk

def judge(replies: Iterable[Message], rnd: RoundView, policy: ReplyPolicy,
          screen: Screen | None = None) -> Verdict:
    """Every reply of one exchange through steps 1 to 5 (5: ``screen``, the wrappers'),
    then the nodes that did not answer: the :class:`Verdict`."""
    replies = list(replies)
    reported = Reports(rnd.reported)
    ok: list[ClientUpdate] = []
    refused: list[Rejection] = []
    seen: set[int] = set()
    for r in replies:
        res, pid = judge_reply(r, rnd, policy, reported, seen)
        if pid is not None:
            reported.add(res.node_id, pid)  # its first report
        (ok if isinstance(res, ClientUpdate) else refused).append(res)  # type: ignore[arg-type]
        seen.add(res.node_id)
    b = bound(ok, rnd, policy)
    refused += b.refused
    ok = sorted(b.updates, key=lambda u: u.partition_id)
    if screen is not None:
        ok, more = screen(ok, rnd.payloads)
        refused += more
    refused += [Rejection(node, rnd.expected.get(node, -1), "no reply before round-timeout")
                for node in validation.missing_nodes(rnd.sent, replies)]
    learnt = {n: p for n, p in reported.items() if n not in rnd.reported}
    return Verdict(ok, refused, replies, rnd.sent, learnt, b.norms, b.cut, b.cut_why,
                   len(b.updates))


def tell(verdict: Verdict, policy: ReplyPolicy, label: str) -> None:
    """Log a verdict: what the method is told once (arrays the clients keep, a metric the
    replies lack, a share cap no weighting holds), each cut claim and each refusal."""
    if kept := next((u.local for u in verdict.updates if u.local), ()):
        policy.tell("local-arrays", INFO, "[%s] train replies leave out arrays %s%s (kept on the "
                    "clients, as in Flower's FedBN how-to): the server keeps the values it sent "
                    "for them", label, list(kept[:5]), " ..." if len(kept) > 5 else "")
    reasons = {rj.reason for rj in verdict.refused}
    for key, (keyword, why) in policy.required.items():
        if policy.needs(key) in reasons:
            policy.tell(f"needs-{key}", ERROR, "[%s] %s needs the metric '%s' in every train "
                        "reply (%s; keyword %s=%r names it); replies without it are refused",
                        label, policy.method, key, why, keyword, key)
    if lacks(w := policy.weighted_by_key) in reasons:
        policy.tell(f"needs-{w}", ERROR, "[%s] train replies lack the metric '%s' that updates "
                    "are weighted by (keyword weighted_by_key=%r names it); replies without it "
                    "are refused", label, w, w)
    share = policy.max_weight_share
    if (any(why.startswith("more than max-weight-share") for why in verdict.cut_why.values())
            and 0 < share < 1 and share * (n := verdict.capped_over) < 1):
        policy.tell("share-below-1/n", WARNING, "[%s] max-weight-share %g is below 1/%d: no "
                    "weighting of a round of %d replies holds it; such a round counts every "
                    "reply as its smallest claim (equal weights, the closest there is)", label,
                    policy.max_weight_share, n, n)
    for u in (u for u in verdict.updates if u.node_id in verdict.cut):
        log(WARNING, "[%s] client %d (node %d) claims num-examples %d, %s: counted as %d", label,
            u.partition_id, u.node_id, verdict.cut[u.node_id][0], verdict.cut_why[u.node_id],
            verdict.cut[u.node_id][1])
    for rj in verdict.refused:
        log(WARNING, "[%s] rejected reply of client %d (node %d): %s", label, rj.partition_id,
            rj.node_id, rj.reason)


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


__all__ = ["EARLIER", "Decoded", "ReplyPolicy", "RoundView", "Screen", "Tell", "Verdict",
           "bound", "capped_weights", "check_values", "decode", "identify", "judge", "judge_reply", "reference_of",
           "screen_reply", "tell", "why_refused"]
