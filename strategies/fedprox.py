"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020)."""

from __future__ import annotations

from logging import INFO
from typing import TYPE_CHECKING, Any, Self, Unpack

from flwr.app import ConfigRecord
from flwr.supercore import log

from fedsys.options import ConfigError
from fedsys.protocol import PROXIMAL_MU
from strategies.fedavg import FedAvgStrategy
from strategies.settings import RoundSettingsKw, config_settings

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fedsys.config import RunConfig
    from strategies.base import Builder

#: the key fedsys's proximal trainer reads mu under (:mod:`clients.fedprox`)
FEDPROX_MU = "fedprox.mu"
#: mu when neither the keyword nor the caller's config gives one: Flower's ``FedProx``
#: default (``proximal_mu=0.0``, FedAvg's local objective; a unit test keeps the two equal).
#: A fedsys run config always gives one, ``fedprox.mu`` (default 0.01, fedsys's trainer's);
#: this default was that 0.01 until issue 77
DEFAULT_MU = 0.0


class FedProxStrategy(FedAvgStrategy):
    r"""FedProx: FedAvg aggregation with a proximal local objective.

    Clients minimise :math:`h_k(w; w^t) = F_k(w) + \frac{\mu}{2}\lVert w - w^t\rVert^2`
    (Eq. 2).  Built like Flower's ``FedProx``: ``proximal_mu`` sets :math:`\mu`, and every
    train instruction carries it as Flower's does, under ``proximal-mu`` (what a client
    written from Flower's FedProx documentation reads, and fedsys's ``fedprox`` trainer,
    :func:`clients.message.chosen_trainer`).  A caller's ``train_config`` may give
    ``fedprox.mu`` instead (fedsys's way, a fedsys run's; it reaches the clients as the
    caller's keys do); both, disagreeing, is an error.
    Neither: :data:`DEFAULT_MU`, Flower's 0.0.  Server aggregation is FedAvg's weighted mean.

    Parameters
    ----------
    proximal_mu : float, optional
        :math:`\mu` (Flower's keyword), at least 0; unset: the caller's ``fedprox.mu``, else
        :data:`DEFAULT_MU`.
    **settings
        The settings every strategy takes (:class:`~strategies.settings.RoundSettings`).
    """

    name = "fedprox"
    default_trainer = "fedprox"

    def __init__(self, *, proximal_mu: float | None = None,
                 **settings: Unpack[RoundSettingsKw]) -> None:
        super().__init__(**settings)
        if proximal_mu is not None and not float(proximal_mu) >= 0:
            raise ConfigError(f"FedProxStrategy: proximal_mu must be >= 0, got {proximal_mu!r}")
        self.proximal_mu = None if proximal_mu is None else float(proximal_mu)

    @classmethod
    def from_config(cls, cfg: RunConfig, build: Builder | None = None) -> Self:
        """The run config's ``fedprox.mu`` as ``proximal_mu``."""
        mu = cfg.group("fedprox").get(FEDPROX_MU)
        return cls(**config_settings(cfg), proximal_mu=None if mu is None else float(mu))

    def round_config(self, server_round: int, config: ConfigRecord | Mapping[str, Any]
                     ) -> dict[str, Any]:
        """The base's settings plus mu under Flower's key."""
        out = super().round_config(server_round, config)
        given = out.get(FEDPROX_MU)
        if given is not None and self.proximal_mu is not None and float(given) != self.proximal_mu:
            raise ConfigError(f"[{self.label}] proximal_mu={self.proximal_mu:g} and the train "
                              f"config's {FEDPROX_MU}={given} disagree: give one")
        mu = self.proximal_mu if self.proximal_mu is not None else (
            float(given) if given is not None else DEFAULT_MU)
        out[PROXIMAL_MU] = mu
        return out

    def summary(self) -> None:
        """The base's summary, then mu."""
        super().summary()
        log(INFO, "[%s] proximal mu %s", self.label,
            f"{self.proximal_mu:g}" if self.proximal_mu is not None else
            f"from the train config's {FEDPROX_MU}, else {DEFAULT_MU:g}")
