"""Issue 77 item 2: a wrapper holds the strategy (``DP(strategy, ...)``, as Flower's DP
wrappers) and what it must know of a method is what the method declares (its ``traits``),
never its name.  A method written here, outside ``strategies/`` (docs/extending.md's
example, and the same made a chain), gets DP's accounting and the robust rules' behaviour
with no edit anywhere else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict

from fedsys import protocol
from fedsys.options import ConfigError, option
from fedsys.params import Params, is_float
from fedsys.params import mean as plain_mean
from fedsys.validation import ClientUpdate
from strategies.base import Aggregate, FedsysStrategy, Traits
from strategies.chain import ChainStrategy
from strategies.dp import DP
from strategies.fedavg import FedAvgStrategy
from strategies.fedelmy import FedSeqStrategy
from strategies.ima import IMA
from strategies.robust import Robust
from strategies.settings import RoundSettingsKw, checked_options
from tests.conftest import ReplyGrid


@dataclass(frozen=True)
class MineOptions:
    """Config keys ``mine.*``."""

    keep: float = option(0.25, "Share of the old global model kept.", bounds="[0, 1)")


class MineStrategy(FedsysStrategy):
    """docs/extending.md's example: FedAvg's mean of the round's replies (the engine's
    ``average``, where a robust rule may stand in), ``keep`` of the old model kept."""

    name = "mine"
    default_trainer = "sgd"
    Options = MineOptions
    traits = Traits(asks="sample", mean="round")

    def __init__(self, *, keep: float = 0.25, **settings: Unpack[RoundSettingsKw]) -> None:
        super().__init__(**settings)
        self.options: MineOptions = checked_options(MineOptions(keep=keep), self.prefix())

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        assert self.params is not None
        avg = self.average(server_round, [u.params for u in updates],
                           [u.num_examples for u in updates])
        k = self.options.keep
        new = {n: (k * self.params[n] + (1 - k) * v).astype(v.dtype) if is_float(v) else v
               for n, v in avg.items()}
        return Aggregate(new, {"mine-kept": k})


class MineChain(ChainStrategy):
    """The example made a chain by its trait: one client per hop, the model relayed."""

    name = "minechain"
    default_trainer = "fedseq"
    traits = Traits(asks="hop", mean="none")


class Forgetful(MineStrategy):
    """Declares a mean but takes it past the engine (fedsys.params.mean directly)."""

    name = "forgetful"

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> Aggregate:
        return Aggregate(plain_mean([u.params for u in updates]))


def model(v: float) -> Params:
    return {"w": np.full(3, v, np.float32)}


def answer(nodes: dict[int, int], fail: dict[int, int] | None = None) -> Any:
    """ClientApps: a query gets the node's partition-id; a train instruction the model
    received plus 0.01, or an error while ``fail`` says so for that partition."""
    fail = dict(fail or {})

    def reply(m: Any) -> Any:
        from flwr.app import Error
        from flwr.common.constant import ErrorCode

        pid = nodes[m.metadata.dst_node_id]
        if m.metadata.message_type == MessageType.QUERY:
            return Message(RecordDict({"metrics": MetricRecord({"partition-id": pid})}), reply_to=m)
        if fail.get(pid, 0) > 0:
            fail[pid] -= 1
            return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"), reply_to=m)
        got = protocol.from_record(m.content["arrays"])
        return Message(RecordDict({
            "arrays": ArrayRecord({k: protocol.Array(v + np.asarray(0.01, v.dtype))
                                   for k, v in got.items()}),
            "metrics": MetricRecord({"partition-id": pid, "num-examples": 10,
                                     "train-loss": 0.1})}), reply_to=m)

    return reply


def run(strategy: Any, nodes: dict[int, int], rounds: int = 4,
        fail: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """``strategy.start`` (the wrapper's) over ``nodes``; the rounds' records."""
    strategy.poll_interval = 0.0
    records: list[dict[str, Any]] = []
    strategy.start(ReplyGrid(nodes, answer=answer(nodes, fail)), protocol.to_record(model(0.0)),
                   num_rounds=rounds, timeout=2.0, on_round=[lambda _, r: records.append(r)])
    return records


CHAIN = {"passes": 3, "num_partitions": 6, "query_partitions": True, "warmup_epochs": 0,
         "node_wait_timeout": 0.2, "fraction_evaluate": 0.0}
SAMPLED = {"clients_per_round": 3, "num_partitions": 10, "query_partitions": True,
           "node_wait_timeout": 0.2, "fraction_evaluate": 0.0}


def test_a_chain_written_outside_strategies_is_accounted_as_fedseq() -> None:
    """Under the same settings and the same failed hops, DP releases MineChain's clients
    as FedSeq's: once in each pass begun, no sampling; the same epsilon every hop."""
    nodes = {100 + i: i for i in range(6)}
    fail = {2: 2, 4: 4}  # client 2 skipped in pass 1, client 4 in passes 1 and 2
    mine, seq = (DP(cls(**CHAIN), noise_multiplier=1.0) for cls in (MineChain, FedSeqStrategy))
    got, want = run(mine, nodes, fail=fail), run(seq, nodes, fail=fail)
    assert len(got) == len(want) == 18 and sum(r["hop-skipped"] for r in got) == 3
    assert [r["dp-epsilon"] for r in got] == [r["dp-epsilon"] for r in want]
    assert mine.sampled == seq.sampled == 0 and mine.passes == seq.passes == 3
    assert mine.spent() == seq.spent() > 0


def test_robust_refuses_a_chain_written_outside_strategies_as_it_refuses_fedseq() -> None:
    """A chain takes no mean (``traits.mean`` none): the rule would never act, said in the
    same sentence for both."""
    said = []
    for cls in (MineChain, FedSeqStrategy):
        with pytest.raises(ConfigError) as err:
            Robust(cls(**CHAIN), rule="median").prepare(10)
        said.append(str(err.value).split(": ", 1)[1].replace(cls.name, "<method>"))
    assert said[0] == said[1] and "a chain relays one model" in said[0]


def test_a_mean_written_outside_strategies_is_replaced_by_the_rule() -> None:
    """MineStrategy's mean of the round's replies is the one a robust rule replaces: an
    attacker's 1000 moves the median by nothing, FedAvg's mean by 250."""
    ups = [ClientUpdate(100 + p, p, model(v), 10) for p, v in enumerate((1.0, 2.0, 3.0, 1000.0))]
    robust, plain = Robust(MineStrategy(keep=0.5), rule="median"), MineStrategy(keep=0.5)
    for s in (robust, plain):
        s.params = model(0.0)
    got, base = robust.aggregated(1, ups), plain.aggregated(1, ups)
    assert got.model is not None and base.model is not None
    np.testing.assert_allclose(got.model["w"], 0.5 * 2.5)                # median 2.5, half kept
    np.testing.assert_allclose(base.model["w"], 0.5 * 251.5)
    assert got.metrics["mine-kept"] == 0.5 and robust.wrappers.metrics()["robust-models"] == 4.0


def test_a_sampled_method_written_outside_strategies_is_accounted_as_fedavg() -> None:
    """DP accounts MineStrategy's rounds as FedAvg's: 3 of 10 sampled each round."""
    nodes = {100 + i: i for i in range(10)}
    mine, avg = DP(MineStrategy(**SAMPLED), noise_multiplier=1.0), DP(FedAvgStrategy(**SAMPLED),
                                                                       noise_multiplier=1.0)
    got, want = run(mine, nodes), run(avg, nodes)
    assert [r["dp-epsilon"] for r in got] == [r["dp-epsilon"] for r in want]
    assert mine.ledger == avg.ledger == {(10, 3): 4}


def test_a_method_that_declares_a_mean_and_takes_another_is_an_error_under_a_rule() -> None:
    """The engine checks the declared extension point: a rule that could not act is said,
    not skipped."""
    s = Robust(Forgetful(), rule="median")
    s.params = model(0.0)
    with pytest.raises(RuntimeError, match=r"declares a mean .* without self.average"):
        s.aggregated(1, [ClientUpdate(100 + p, p, model(float(p)), 10) for p in range(3)])
    plain = Forgetful()  # unwrapped, nothing to replace: it runs
    plain.params = model(0.0)
    assert plain.aggregated(1, [ClientUpdate(100, 0, model(1.0), 10)]).model is not None


def test_a_wrapper_is_a_strategy_that_holds_another() -> None:
    """Flower's shape: the strategy first; reads, ``label``, state and the round methods are
    the wrapped strategy's; a strategy is wrapped from outside in, once."""
    inner = FedAvgStrategy(fraction_train=0.5)
    s = IMA(DP(inner), window=2)
    assert s.strategy.strategy is inner and s.engine is inner and s.name == "ima"
    assert s.label == inner.label == "fedavg+dp+ima" and s.settings is inner.settings
    assert [w.name for w in inner.wrappers] == ["dp", "ima"]
    s.run_label = "mine"                       # the strategy's state is written there
    assert inner.label == "mine" and "run_label" not in vars(s)
    state = s.state_dict()
    assert set(state["wrappers"]) == {"dp", "ima"} and state == inner.state_dict()
    with pytest.raises(TypeError, match="wrapped already"):
        Robust(inner)
    with pytest.raises(TypeError, match="wraps a fedsys strategy"):
        IMA(object())
    with pytest.raises(ConfigError, match=r"dp\.base=ima: DP must be applied first"):
        DP(IMA(FedAvgStrategy())).prepare(10)
