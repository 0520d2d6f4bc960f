"""The round loop, an object of its own: Flower's template ``Strategy.start`` over any
strategy that offers the calls in :class:`Looped` (every fedsys strategy,
:class:`strategies.rounds.RoundEngine`).

One :class:`RoundLoop` runs the rounds ``strategy.round + 1 .. num_rounds`` (a resumed
strategy goes on after its checkpoint's round): each a training round (the strategy's
``run_round``: Flower's configure, send, aggregate; a chain's hop), then the caller's
analysis of it (``estimator_fn``), then, where the strategy says so, federated and central
evaluation, then the round's record (its metrics, the traffic totals, the round time) to the
strategy's history and the caller's ``on_round`` callbacks.  What travels between the steps
of a round is the one record; the loop keeps nothing of a round after it.  What the caller
hands in (the callbacks, the estimator) is the loop's, not the strategy's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from logging import ERROR
from typing import Any, Protocol

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from fedsys import protocol as proto
from fedsys import transport
from fedsys.options import ConfigError
from fedsys.params import Params
from fedsys.validation import ClientUpdate
from strategies.exchange import Traffic
from strategies.replies import ReplyPolicy, Verdict, why_refused

#: Flower's ``evaluate_fn``: ``(round, arrays) -> metrics`` of the global model, centrally.
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
#: Called with the strategy and each round's record, once the round is done (``start``'s
#: ``on_round``: fedsys's run writes its metrics and checkpoints there).
RoundHook = Callable[[Any, dict[str, Any]], None]
#: A round's analysis: ``(round, accepted updates, new global model) -> metrics`` for the
#: round's record (``start``'s ``estimator_fn``; fedsys's ``estimators: true``).
EstimatorFn = Callable[[int, list[ClientUpdate], Params], dict[str, float]]


class Looped(Protocol):
    """What the loop asks of a strategy."""

    round: int
    num_rounds: int
    round_timeout: float
    poll_interval: float
    params: Params | None
    traffic: Traffic
    verdict: Verdict
    usable_rounds: int
    history: list[dict[str, Any]]
    replies: ReplyPolicy
    run_label: str

    @property
    def label(self) -> str: ...
    def prepare(self, num_rounds: int) -> None: ...
    def discover(self, grid: Grid) -> None: ...
    def summary(self) -> None: ...
    def run_round(self, grid: Grid, server_round: int, train_config: ConfigRecord) -> dict[str, Any]: ...
    def evaluate_now(self, rnd: int) -> bool: ...
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]: ...
    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None: ...


class RoundLoop:
    """Flower's ``start`` for one call (its arguments, as Flower documents them).

    Parameters
    ----------
    strategy : Looped
        Whose rounds run.
    grid : Grid
        Flower's grid the messages go through.
    timeout : float
        Bounds each round's wait for replies.
    train_config, evaluate_config : ConfigRecord, optional
        Reach the clients with their keys unchanged (the strategy's ``round_config``).
    evaluate_fn : EvaluateFn, optional
        Evaluates the global model centrally, also before round 1 (not after a resume).
    on_round : sequence of RoundHook
        Called in order with the strategy and each round's record (round 0's too, with
        ``evaluate_fn``), after the round.
    estimator_fn : EstimatorFn, optional
        Analyses each round that made a new model from updates: its metrics join the
        round's record.  Refused over a private strategy (a DP wrapper): it reads the raw
        client models.
    label : str
        How the strategy's log lines name it for this run (empty: its method and wrappers).
    """

    def __init__(self, strategy: Looped, grid: Grid, timeout: float,
                 train_config: ConfigRecord | None, evaluate_config: ConfigRecord | None,
                 evaluate_fn: EvaluateFn | None, *, on_round: Sequence[RoundHook] = (),
                 estimator_fn: EstimatorFn | None = None, label: str = "") -> None:
        self.strategy = strategy
        self.grid = grid
        self.timeout = float(timeout)
        self.train_config = train_config if train_config is not None else ConfigRecord()
        self.evaluate_config = evaluate_config if evaluate_config is not None else ConfigRecord()
        self.evaluate_fn = evaluate_fn
        self.on_round = list(on_round)
        self.estimator_fn = estimator_fn
        self.label = label
        self.result = Result()

    def run(self, initial_arrays: ArrayRecord, num_rounds: int) -> Result:
        """The rounds up to ``num_rounds`` (which sets the schedule: ``prepare``)."""
        s = self.strategy
        if self.label:
            s.run_label = self.label
        s.prepare(num_rounds)
        if self.estimator_fn is not None and s.replies.private:
            raise ConfigError(f"[{s.label}] estimator_fn reads the raw client models every "
                              "round, outside the differential privacy of the strategy's "
                              "releases (its DP wrapper): start it without one")
        s.round_timeout = self.timeout
        if s.params is None:
            s.params = proto.from_record(initial_arrays)
        s.discover(self.grid)
        s.summary()
        self.evaluate_initial()
        for rnd in range(s.round + 1, s.num_rounds + 1):
            self.emit(self.train(rnd))
        if s.usable_rounds == 0 and s.round > 0:
            log(ERROR, "[%s] no round of the run used a reply: %d rounds, every train reply "
                "refused or missing (the last round's: %s); the model is the one it started "
                "from", s.label, s.round, why_refused(s.verdict.refused))
        assert s.params is not None
        self.result.arrays = proto.to_record(s.params)
        return self.result

    def train(self, rnd: int) -> dict[str, Any]:
        """Round ``rnd``: training, its evaluation, the round's record."""
        s, t0, before = self.strategy, time.monotonic(), self.strategy.params
        train = s.run_round(self.grid, rnd, self.train_config)
        if self.estimator_fn is not None and s.params is not before and s.verdict.updates:
            assert s.params is not None
            train.update(self.estimator_fn(rnd, s.verdict.updates, s.params))
        train.update(s.traffic.totals())
        if train.get("clients-ok", 0) > 0:
            s.usable_rounds += 1
        record: dict[str, Any] = {"round": rnd, **train}
        if s.evaluate_now(rnd):
            record.update(self.evaluate(rnd))
        self.result.train_metrics_clientapp[rnd] = proto.metric_record(
            {k: v for k, v in train.items() if isinstance(v, int | float)})
        s.round = rnd
        record["round-time"] = time.monotonic() - t0
        return record

    def evaluate(self, rnd: int) -> dict[str, float]:
        """Federated (``fed-*`` keys) and central evaluation of the current model."""
        s, out = self.strategy, {}
        assert s.params is not None
        asked = list(s.configure_evaluate(rnd, proto.to_record(s.params), self.evaluate_config,
                                          self.grid))
        fed = s.aggregate_evaluate(rnd, transport.send_and_receive(
            self.grid, asked, s.round_timeout, s.poll_interval)[0])
        if fed is not None:
            self.result.evaluate_metrics_clientapp[rnd] = fed
            out.update({f"fed-{k}": float(v) for k, v in fed.items()
                        if isinstance(v, int | float) and not isinstance(v, bool)})
        if self.evaluate_fn is not None:
            res = self.evaluate_fn(rnd, proto.to_record(s.params))
            if res is not None:
                self.result.evaluate_metrics_serverapp[rnd] = res
                out.update({k: float(v) for k, v in res.items()})  # type: ignore[arg-type]
        return out

    def evaluate_initial(self) -> None:
        """Central evaluation of the starting model as round 0 (not after a resume)."""
        s = self.strategy
        if s.round == 0 and self.evaluate_fn is not None:
            assert s.params is not None
            res = self.evaluate_fn(0, proto.to_record(s.params))
            if res is not None:
                self.result.evaluate_metrics_serverapp[0] = res
                self.emit({"round": 0, **{k: float(v) for k, v in res.items()},  # type: ignore[arg-type]
                           "round-time": 0.0})

    def emit(self, record: dict[str, Any]) -> None:
        """The round's record to the strategy's history and the ``on_round`` callbacks."""
        self.strategy.history.append(record)
        for hook in self.on_round:
            hook(self.strategy, record)


__all__ = ["EstimatorFn", "EvaluateFn", "Looped", "RoundHook", "RoundLoop"]
