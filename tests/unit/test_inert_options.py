"""No default that silently turns a method into FedAvg (issue 45 item 5): an option value
that leaves a method inert for the run's length is refused at start with one line naming
it, in a strategy's ``start`` and in ``fedsys run``; with no option set, every method does
what its name says over the default 30 rounds (FedCDA selects after its warmup, a quarter
of the run as the paper's 50 of 200; IMA averages from t_s = 0.75 T; FedCross mixes)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedsys import protocol
from fedsys.config import ConfigError
from fedsys_launch import config_schema
from fedsys_launch.commands.cli import main
from strategies import REGISTRY
from strategies.fedavg import FedAvgStrategy
from strategies.fedcda import FedCDAStrategy
from strategies.fedcross import FedCrossStrategy
from strategies.ima import IMA

ROUNDS = 30  # the default config's num-server-rounds
NODES = {101: 0, 205: 1, 333: 2, 478: 3}


def _grid(reply_grid: Any) -> Any:
    """Clients that answer a train instruction with the received model moved by a seeded
    step, their partition-id, example count and Flower's ``train_loss``."""
    rng = np.random.default_rng(0)

    def answer(m: Message) -> Message:
        assert m.metadata.message_type == MessageType.TRAIN  # no query, no evaluate here
        pid = NODES[m.metadata.dst_node_id]
        got = protocol.from_record(m.content["arrays"])
        new = {k: (v + rng.normal(0, 0.1, v.shape)).astype(v.dtype) for k, v in got.items()}
        return Message(RecordDict({
            "arrays": ArrayRecord({k: protocol.Array(v) for k, v in new.items()}),
            "metrics": MetricRecord({"partition-id": pid, "num-examples": 10 + pid,
                                     "train_loss": float(rng.uniform(0.5, 1.5))})}),
            reply_to=m)

    return reply_grid(NODES, answer)


def _run(strategy: Any, grid: Any) -> list[dict[str, Any]]:
    strategy.poll_interval = 0.0
    strategy.settings = dataclasses.replace(strategy.settings, fraction_evaluate=0.0)
    records: list[dict[str, Any]] = []
    model = {"w": np.zeros((2, 3), np.float32)}
    strategy.start(grid, protocol.to_record(model), num_rounds=ROUNDS, timeout=2.0,
                   train_config=ConfigRecord({"lr": 0.1}),
                   on_round=[lambda s, r: records.append(r)])
    return records


def test_fedcda_with_no_option_set_selects_after_a_quarter_of_the_run(reply_grid):
    s = FedCDAStrategy(fraction_train=0.5, min_available_nodes=4)
    recs = _run(s, _grid(reply_grid))
    assert s.warmup == ROUNDS // 4 == 7
    warm = [int(r["round"]) for r in recs if r.get("fedcda-warmup") == 1.0]
    selecting = [int(r["round"]) for r in recs if r.get("fedcda-warmup") == 0.0]
    assert warm == list(range(1, 8)) and selecting == list(range(8, ROUNDS + 1))


def test_ima_with_no_option_set_averages_from_three_quarters_of_the_run(reply_grid):
    s = IMA(FedAvgStrategy(fraction_train=0.5, min_available_nodes=4))
    recs = _run(s, _grid(reply_grid))
    active = [int(r["round"]) for r in recs if r.get("ima-active") == 1.0]
    assert active == list(range(23, ROUNDS + 1))  # t_s = floor(0.75 * 30) = 22, 0-indexed


def test_fedcross_with_no_option_set_mixes_every_round(reply_grid):
    s = FedCrossStrategy(fraction_train=1.0, min_available_nodes=4)
    recs = _run(s, _grid(reply_grid))
    assert {r.get("fedcross-phase") for r in recs if r["round"] > 0} == {0.0}  # "cross"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_method_with_no_option_set_starts_for_the_default_run(name):
    cfg = config_schema.build({"strategy": name})
    assert cfg.num_server_rounds == ROUNDS
    config_schema.make_strategy(cfg)  # prepare(30): no inert option


@pytest.mark.parametrize(("make", "needle"), [
    (lambda: FedCDAStrategy(warmup=50), "fedcda.warmup=50 makes the FedAvg warmup 50 rounds"),
    (lambda: FedCDAStrategy(warmup=30), "fedcda.warmup=30"),
    (lambda: FedCDAStrategy(warmup_fraction=1.0), "fedcda.warmup-fraction=1"),
    (lambda: IMA(FedAvgStrategy(), start_round=30),
     "ima.start-round=30 starts IMA at round 31, after the run's last round 30"),
    (lambda: IMA(FedAvgStrategy(), window=1), "ima.window=1"),
    (lambda: FedCrossStrategy(alpha=1.0), "fedcross.alpha=1"),
    (lambda: FedCrossStrategy(warmup=30), "fedcross.warmup=30 covers the whole run"),
])
def test_an_inert_option_is_refused_at_start_naming_it(make, needle, reply_grid):
    s = make()
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        s.start(_grid(reply_grid), protocol.to_record({"w": np.zeros(2, np.float32)}),
                num_rounds=ROUNDS, timeout=1.0)


@pytest.mark.parametrize("make", [
    lambda: FedCDAStrategy(warmup=29),                       # selects in the last round
    lambda: IMA(FedAvgStrategy(), start_round=29),      # averages in the last round
    lambda: IMA(FedAvgStrategy(), window=1, average=False),  # the control, on purpose
    lambda: FedCrossStrategy(alpha=1.0, dynamic_alpha_rounds=10),  # alpha ramps from 0.5
])
def test_values_that_still_act_are_allowed(make):
    make().prepare(ROUNDS)


def test_fedsys_run_refuses_an_inert_option_in_one_line_before_any_engine(capsys):
    code = main(["run", "--set", "dataset=synthetic", "--set", "model=mlp",
                 "--set", "strategy=fedcda", "--set", "fedcda.warmup=50"])
    err = capsys.readouterr().err
    assert code != 0
    lines = [x for x in err.splitlines() if "fedcda.warmup=50" in x]
    assert len(lines) == 1 and "never select" in lines[0] and "Traceback" not in err
