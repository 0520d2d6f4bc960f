"""Robust aggregation composed with any fedsys strategy (issue 42 item 2): the
coordinate-wise median, the trimmed mean and multi-Krum in place of a strategy's mean of
the round's models.  The maths is in :mod:`fedsys.robust`.

A :class:`~strategies.wrapper.StrategyWrapper` like IMA.  Each strategy names the mean it
hands over (:meth:`~strategies.base.FedsysStrategy.average`), so what the rule replaces is,
per method:

- FedAvg, FedProx: the example-weighted mean of the accepted updates (Alg. 1);
- FedAdam, FedYogi: the client mean before the server optimiser step (the pseudo-gradient
  is then taken from the robust mean);
- FedCDA: in its warm-up the FedAvg mean; after it the uniform mean of every seen client's
  selected model (Alg. 1 line 10): the selection (Eq. 8) is FedCDA's own and unchanged;
- FedCross: the mean of the K middleware models that is the global model (Alg. 1 line 13,
  what is evaluated and deployed) and, in the warm-up, the uploads' mean every slot is reset
  to.  The pairwise mixing of a slot with its collaborator (line 12) is not a mean over
  clients and stays, so an attacker's upload still moves its own slot; the rule keeps it
  out of the global model;
- one-shot FedAvg and parallel FedELMY: the server's mean of the replies;
- IMA: the base strategy's mean below IMA's window (``robust.base: ima`` with ``ima.base``);
- FedSeq and FedELMY's chain relay one model from client to client and never average:
  the wrapper refuses them at start (it would be inert), and the update bounds of
  ``max-update-ratio`` are their defence.

The rules read no example counts: a claimed weight buys no influence.  In a Flower app::

    strategy = FedAvgStrategy(fraction_train=0.5).wrap(Robust(rule="multi-krum", krum_f=1))

``strategy: robust`` with ``robust.base: <strategy>`` builds the same from a run config.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from logging import INFO
from typing import Any

from flwr.supercore import log

from fedsys import robust
from fedsys.options import REGISTERED_STRATEGIES, option, parse_group
from fedsys.params import Params
from strategies.wrapper import StrategyWrapper, Wrapped

#: Strategies that relay one model along a chain and take no mean.
CHAINS = ("fedseq", "fedelmy")


@dataclass(frozen=True)
class RobustOptions:
    """The robust aggregator's options (config keys ``robust.*``)."""

    base: str = option("fedavg", "robust: the strategy whose mean of the round's models is "
                       "replaced.", choices=REGISTERED_STRATEGIES)
    rule: str = option("median", "robust: the rule in place of the mean: median "
                       "(coordinate-wise), trimmed-mean, or multi-krum.",
                       choices=("median", "trimmed-mean", "multi-krum"))
    trim: float = option(0.1, "robust: the trimmed mean's beta, the fraction of the values "
                         "dropped at each end of every coordinate.", bounds="[0, 0.5)")
    krum_f: int = option(1, "robust: multi-Krum's f, the attackers it is built to withstand.",
                         bounds=">= 0")
    krum_keep: int = option(0, "robust: multi-Krum's m, the models averaged (0: n - f; 1: "
                            "Krum).", bounds=">= 0")


class Robust(StrategyWrapper):
    """A robust rule in place of the wrapped strategy's mean of the round's models.

    Parameters
    ----------
    **options
        :class:`RobustOptions`'s fields (``base`` is only read by :meth:`from_config`).
    """

    name = "robust"
    Options = RobustOptions
    replaces_mean = True

    def __init__(self, **options: Any) -> None:
        self.options: RobustOptions = parse_group(RobustOptions, self.name, options)
        self.kept = 0.0
        self.offered = 0.0

    def inert_options(self, strategy: Wrapped, num_rounds: int) -> list[str]:
        """A chain takes no mean: the rule would never act."""
        if strategy.name in CHAINS:
            return [f"robust on {strategy.name}: a chain relays one model from client to "
                    f"client and takes no mean for robust.rule={self.options.rule} to replace "
                    f"(max-update-ratio bounds each hop)"]
        return []

    def combine(self, server_round: int, models: Sequence[Params],
                weights: Sequence[float] | None) -> Params | None:
        """The rule over ``models`` (``weights`` are not read)."""
        o = self.options
        self.offered, self.kept = float(len(models)), float(len(models))
        if o.rule == "median":
            return robust.coordinate_median(models)
        if o.rule == "trimmed-mean":
            return robust.trimmed_mean(models, o.trim)
        keep = o.krum_keep or max(len(models) - o.krum_f, 1)
        out, kept = robust.multi_krum(models, o.krum_f, min(keep, len(models)))
        self.kept = float(len(kept))
        return out

    def round_metrics(self) -> dict[str, float]:
        """``robust-models`` (the models the rule saw) and ``robust-kept`` (those
        multi-Krum averaged; all of them for the median and the trimmed mean)."""
        return {"robust-models": self.offered, "robust-kept": self.kept}

    def summary(self) -> None:
        """Log the rule."""
        o = self.options
        detail = {"median": "", "trimmed-mean": f", beta {o.trim:g}",
                  "multi-krum": f", f {o.krum_f}, m {o.krum_keep or 'n - f'}"}[o.rule]
        log(INFO, "[robust] %s in place of the mean%s", o.rule, detail)


__all__ = ["CHAINS", "Robust", "RobustOptions"]
