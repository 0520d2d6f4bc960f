r"""Robust aggregation composed with any fedsys strategy (issue 42 item 2): the
coordinate-wise median, the trimmed mean and multi-Krum in place of a strategy's mean of
the round's models.  The maths is in :mod:`fedsys.robust`.

A :class:`~strategies.wrapper.StrategyWrapper` like IMA, holding the strategy whose mean it
replaces.  A method that takes a mean of the round's models declares it (``traits.mean``,
:class:`strategies.wrapper.Traits`) and takes it through the engine's
:meth:`~strategies.base.FedsysStrategy.average`, where the rule stands in; what the rule
replaces is, per method:

- FedAvg, FedProx: the example-weighted mean of the accepted updates (Alg. 1);
- FedAdam, FedYogi, FedAvgM: the client mean before the server optimiser step (the
  pseudo-gradient is then taken from the robust mean);
- FedCDA: in its warm-up the FedAvg mean; after it the uniform mean of every seen client's
  selected model (Alg. 1 line 10): the selection (Eq. 8) is FedCDA's own and unchanged;
- FedCross: the mean of the K middleware models that is the global model (Alg. 1 line 13,
  what is evaluated and deployed) and, in the warm-up, the uploads' mean every slot is reset
  to.  The pairwise mixing of a slot with its collaborator (line 12) is not a mean over
  clients and stays, so an attacker's upload still moves its own slot; the rule keeps it
  out of the global model;
- one-shot FedAvg and parallel FedELMY: the server's mean of the replies;
- IMA: the base strategy's mean below IMA's window (``robust.base: ima`` with ``ima.base``);
- FedSeq and FedELMY's chain relay one model from client to client and never average
  (``traits.mean`` none, as any method that declares no mean): the wrapper refuses them at
  start (it would be inert), and the update bounds of ``max-update-ratio`` are their defence.

The rules read no example counts: a claimed weight buys no influence.

A rule that cannot hold over the models it is given is never applied silently (issue 65
item C; :mod:`fedsys.robust` says when each holds): multi-Krum over :math:`n \le 2f + 2`
models, and a trimmed mean that trims :math:`\lfloor\beta n\rfloor = 0` values (the plain
mean), are refused at start when every round is certain to have so few (the method's most
models a round, :func:`most_models`: ``clients-per-round`` where its mean is of the round's
replies, ``traits.mean`` round), and otherwise replaced in that
round by the coordinate-wise median, which holds while fewer than half attack, with a WARNING
naming the numbers (``robust-fallback`` 1).  A ``robust.krum-keep`` above :math:`n - f`
averages at least one of f attackers: refused at start likewise, else cut to :math:`n - f`
that round with a WARNING.

In a Flower app::

    strategy = Robust(FedAvgStrategy(fraction_train=0.5), rule="multi-krum", krum_f=1)

``strategy: robust`` with ``robust.base: <strategy>`` builds the same from a run config.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

from flwr.supercore import log

from fedsys import robust
from fedsys.options import REGISTERED_STRATEGIES, option, parse_group
from fedsys.params import Params
from strategies.wrapper import StrategyWrapper, Wrapped


@dataclass(frozen=True)
class RobustOptions:
    """The robust aggregator's options (config keys ``robust.*``)."""

    base: str = option("fedavg", "robust: the strategy whose mean of the round's models is "
                       "replaced.", choices=REGISTERED_STRATEGIES)
    rule: str = option("median", "robust: the rule in place of the mean: median "
                       "(coordinate-wise), trimmed-mean, or multi-krum.",
                       choices=("median", "trimmed-mean", "multi-krum"))
    trim: float = option(0.2, "robust: the trimmed mean's beta, the fraction of the values "
                         "dropped at each end of every coordinate (floor(beta x n) of n: one that "
                         "drops none is refused at start, or replaced by the median that round; "
                         "0.2: Flower's FedTrimmedAvg, 0.1 before issue 77).", bounds="[0, 0.5)")
    krum_f: int = option(0, "robust: multi-Krum's f, the attackers it is built to withstand "
                         "(it needs more than 2f + 2 models: fewer are refused at start, or the "
                         "median stands in that round; 0: Flower's Krum and MultiKrum, 1 before "
                         "issue 77).", bounds=">= 0")
    krum_keep: int = option(1, "robust: multi-Krum's m, the models averaged (0: n - f; 1: "
                            "Krum, Flower's MultiKrum default, n - f before issue 77; at most "
                            "n - f).", bounds=">= 0")


def most_models(strategy: Wrapped) -> int | None:
    """The most models the replaced mean of ``strategy`` can see in one round, where the
    configuration fixes it: ``clients-per-round`` for a method whose mean is of the round's
    replies (``traits.mean`` round: FedAvg's, FedCross's K slots), else the number of
    partitions (FedCDA's mean of every seen client's selected model, a parallel plan's of
    all clients; ``None``: not known before the run)."""
    per_round = strategy.settings.clients_per_round if strategy.traits.mean == "round" else None
    most = per_round or strategy.settings.num_partitions
    return int(most) if most else None


def cannot_hold(o: RobustOptions, n: int) -> str | None:
    r"""Why ``o``'s rule cannot hold over ``n`` models (``None``: it can): multi-Krum needs
    :math:`n > 2f + 2` (Blanchard et al. 2017, Prop. 1); a trimmed mean that trims
    :math:`\lfloor\beta n\rfloor = 0` values is the plain mean (Yin et al. 2018, Def. 2)."""
    if o.rule == "trimmed-mean" and robust.trimmed_count(n, o.trim) == 0:
        return (f"robust.trim={o.trim:g} trims floor({o.trim:g} x {n}) = 0 values at each end "
                f"of {n} models (the plain mean)")
    if o.rule == "multi-krum" and not robust.krum_holds(n, o.krum_f):
        return (f"multi-Krum with robust.krum-f={o.krum_f} needs more than 2f + 2 = "
                f"{2 * o.krum_f + 2} models (Blanchard et al. 2017, Prop. 1), not {n}")
    return None


def keeps_too_many(o: RobustOptions, n: int) -> str | None:
    """Why ``robust.krum-keep`` is too large for ``n`` models (``None``: it is not): more
    than :math:`n - f` averages at least one of f attackers."""
    if o.rule == "multi-krum" and o.krum_keep > n - o.krum_f:
        return (f"robust.krum-keep={o.krum_keep} averages more than n - f = {n - o.krum_f} of "
                f"{n} models (f = {o.krum_f}): at least one of f attackers would be kept")
    return None


class Robust(StrategyWrapper):
    """A robust rule in place of the wrapped strategy's mean of the round's models.

    Parameters
    ----------
    strategy : FedsysStrategy or StrategyWrapper
        The strategy whose mean is replaced (see :class:`~strategies.wrapper.StrategyWrapper`).
    **options
        :class:`RobustOptions`'s fields (``base`` is only read by :meth:`from_config`).
    """

    name = "robust"
    Options = RobustOptions
    replaces_mean = True

    def __init__(self, strategy: Any, **options: Any) -> None:
        self.options: RobustOptions = parse_group(RobustOptions, self.name, options)
        super().__init__(strategy)
        self.kept = 0.0
        self.offered = 0.0
        self.fallback = 0.0

    def inert_options(self, num_rounds: int) -> list[str]:
        """A method that takes no mean (a chain: ``traits.mean`` none): the rule would never
        act.  A rule that cannot hold in any round (:func:`cannot_hold`,
        :func:`keeps_too_many` over :func:`most_models`)."""
        strategy = self.engine
        if strategy.traits.mean == "none":
            what = ("a chain relays one model from client to client and takes" if
                    strategy.traits.chain else "it declares (traits.mean) that it takes")
            return [f"robust on {strategy.name}: {what} no mean for robust.rule="
                    f"{self.options.rule} to replace (max-update-ratio bounds each "
                    f"{'hop' if strategy.traits.chain else 'update'})"]
        n = most_models(strategy)
        if n is None:
            return []
        whose = "clients-per-round" if strategy.traits.mean == "round" else "num-clients"
        return [f"robust on {strategy.name}: {why}, and no round has more than {n} ({whose})"
                for why in (cannot_hold(self.options, n), keeps_too_many(self.options, n))
                if why is not None]

    def combine(self, server_round: int, models: Sequence[Params],
                weights: Sequence[float] | None) -> Params | None:
        """The rule over ``models`` (``weights`` are not read); where it cannot hold over
        so few (:func:`cannot_hold`), the coordinate-wise median, with a WARNING."""
        o, n = self.options, len(models)
        self.offered, self.kept, self.fallback = float(n), float(n), 0.0
        why = cannot_hold(o, n)
        if why is not None:
            self.fallback = 1.0
            f = o.krum_f if o.rule == "multi-krum" else None
            beyond = (f" (with f = {f} of {n} models no rule holds: the median needs fewer than "
                      f"half)" if f is not None and 2 * f >= n else "")
            log(WARNING, "[%s] round %d: %s: the coordinate-wise median instead, which holds "
                "while fewer than half of the models are an attacker's%s", self.engine.label,
                server_round, why, beyond)
            return robust.coordinate_median(models)
        if o.rule == "median":
            return robust.coordinate_median(models)
        if o.rule == "trimmed-mean":
            return robust.trimmed_mean(models, o.trim)
        keep = o.krum_keep or n - o.krum_f
        if (too := keeps_too_many(o, n)) is not None:
            log(WARNING, "[%s] round %d: %s: it keeps n - f = %d instead", self.engine.label,
                server_round, too, n - o.krum_f)
            keep = n - o.krum_f
        out, kept = robust.multi_krum(models, o.krum_f, keep)
        self.kept = float(len(kept))
        return out

    def round_metrics(self) -> dict[str, float]:
        """``robust-models`` (the models the rule saw), ``robust-kept`` (those multi-Krum
        averaged; all of them for the median and the trimmed mean) and ``robust-fallback``
        (1: the rule could not hold and the median stood in)."""
        return {"robust-models": self.offered, "robust-kept": self.kept,
                "robust-fallback": self.fallback}

    def own_summary(self) -> None:
        """Log the rule."""
        o = self.options
        detail = {"median": "", "trimmed-mean": f", beta {o.trim:g}",
                  "multi-krum": f", f {o.krum_f}, m {o.krum_keep or 'n - f'}"}[o.rule]
        log(INFO, "[robust] %s in place of the mean%s", o.rule, detail)


__all__ = ["Robust", "RobustOptions", "cannot_hold", "keeps_too_many", "most_models"]
