"""What the reply pipeline (:mod:`strategies.replies`) judges replies into and the
arithmetic of its bounds: a train reply becomes a :class:`ClientUpdate` or a
:class:`Rejection` that names the node, its client and the reason; a round's claimed
weights are bounded (:func:`weight_refusals`, :func:`ratio_capped_claims`,
:func:`capped_claims`), its update norms
(:func:`norm_refusals`, with the history of :func:`history_norms`) and its silent nodes
named (:func:`missing_nodes`).  Pure functions with golden tests
(``tests/unit/test_update_bounds.py``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from flwr.app import Message

from fedsys.params import Params


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
    meds = others_medians(claims) if max_ratio > 0 and len(claims) > 1 else {}
    out: dict[int, str] = {}
    for node, n in claims.items():
        if node in declared:
            if n > declared[node]:
                out[node] = (f"claims num-examples {n:g}, but its partition holds "
                             f"{declared[node]} (its answer to the query)")
            continue
        if max_ratio > 0 and len(claims) > 1:
            med = meds[node]
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
    out: dict[int, str] = {}
    for node, n, med, among_others in _yardsticks(norms, earlier, max_ratio):
        if med > 0 and n > max_ratio * med:
            whose = "the round's other replies" if among_others else "the updates before"
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
    measured = {node for node, _, med, _ in _yardsticks(norms, earlier, max_ratio) if med > 0}
    kept = [(node, n) for node, n in norms.items() if node in accepted]
    bounded = [n for node, n in kept if node in measured]
    return bounded if bounded or not kept else [min(n for _, n in kept)]


def _yardsticks(norms: Mapping[int, float], earlier: Sequence[float], max_ratio: float
                ) -> list[tuple[int, float, float, bool]]:
    """Each node's ``(node, norm, yardstick, whether among the round's others)`` where
    the bound applies (:func:`norm_refusals`): the median of the round's other norms when
    there are two or more, else of ``earlier``; none with the bound off or no yardstick."""
    import statistics

    if max_ratio <= 0 or (len(norms) < 3 and not earlier):
        return []
    if len(norms) >= 3:
        meds = others_medians(norms)
        return [(node, n, meds[node], True) for node, n in norms.items()]
    med = statistics.median(earlier)
    return [(node, n, med, False) for node, n in norms.items()]


def others_medians(values: Mapping[int, float]) -> dict[int, float]:
    """Each key's median of the *other* values: ``statistics.median([v for k, v in
    values.items() if k != key])`` for every key (two or more values), the same numbers,
    from one sort (the direct way sorts a list per key: a round of 100 replies sorted
    100 lists three times).  Values that are not all finite take the direct way."""
    import bisect
    import statistics

    if len(values) < 2:
        raise ValueError("a median of the others needs two or more values")
    if not all(math.isfinite(v) for v in values.values()):
        return {k: statistics.median([v for j, v in values.items() if j != k]) for k in values}
    s = sorted(values.values())
    m = len(s) - 1  # the others of each key

    def other(i: int, j: int) -> float:  # the j-th of the others of s[i]
        return s[j] if j < i else s[j + 1]

    out: dict[int, float] = {}
    for k, v in values.items():
        i = bisect.bisect_left(s, v)  # one of v's places: leaving out any gives the same list
        h = m // 2
        out[k] = other(i, h) if m % 2 else (other(i, h - 1) + other(i, h)) / 2
    return out


def ratio_capped_claims(claims: Mapping[int, float], max_ratio: float) -> dict[int, float]:
    """Claimed weights far above the round's others, cut: ``{node: its weight after the
    cut}``, each claim above ``max_ratio`` times the median of the round's *other* claims
    counted as that many times it (leave-one-out, so one huge claim cannot move its own
    yardstick, as :func:`weight_refusals`; from two claims on; 0: no such bound).

    The bound binds on outliers only: a site that simply holds more data than the others
    (50 beside 5 and 5 is 10 times the median of the others) keeps its claim, and an
    honest round is weighted as Flower weights it.  A claim above the bound keeps a say
    (it is counted, not refused) but buys at most ``max_ratio`` times the median: of a
    round of ``n`` replies, at most ``max_ratio / (max_ratio + n - 1)`` of a weighted
    mean when the others claim alike.
    """
    if max_ratio <= 0 or len(claims) < 2:
        return {}
    meds = others_medians(claims)
    return {node: max_ratio * meds[node] for node, n in claims.items()
            if meds[node] > 0 and n > max_ratio * meds[node]}


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
           "norm_refusals", "others_medians", "ratio_capped_claims", "share_cap_level",
           "weight_refusals"]
