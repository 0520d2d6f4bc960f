"""The message protocol: typed settings, named extra models both ways, trainer state."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import MessageType, RecordDict

from fedsys import protocol


def model(v: float = 0.0) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), v, np.float32), "n": np.array(7, dtype=np.int64)}


def sent(m):
    m.metadata.__dict__["_message_id"] = "m1"
    return {"m1": m}


def test_instruction_keeps_types_and_carries_named_models():
    m = protocol.message(5, MessageType.TRAIN, model(1.0),
                         {"lr": 0.5, "local-epochs": 2, "trainer": "sgd", "flag": True},
                         models={"anchor": model(2.0)})
    s = protocol.settings(m.content)
    assert s == {"lr": 0.5, "local-epochs": 2, "trainer": "sgd", "flag": True}
    assert isinstance(s["local-epochs"], int) and isinstance(s["flag"], bool)
    extra = protocol.extra_models(m.content)
    assert list(extra) == ["anchor"] and np.all(extra["anchor"]["w"] == 2.0)


def test_a_reply_may_carry_a_pool_and_each_model_is_checked():
    instr = protocol.message(5, MessageType.TRAIN, model(1.0), {})
    ok = protocol.train_reply(instr, model(2.0), 10, {"train-loss": 0.3},
                              models={"pool-0": model(3.0), "pool-1": model(4.0)})
    upd = protocol.parse_train_reply(ok, sent(instr), {5: 1}, None)
    assert isinstance(upd, protocol.ClientUpdate)
    assert upd.partition_id == 1 and upd.num_examples == 10 and sorted(upd.models) == ["pool-0",
                                                                                       "pool-1"]
    bad_pool = {"w": np.zeros((3, 3), np.float32), "n": np.array(7, dtype=np.int64)}
    bad = protocol.train_reply(instr, model(2.0), 10, {}, models={"pool-0": bad_pool})
    rj = protocol.parse_train_reply(bad, sent(instr), {5: 1}, None)
    assert isinstance(rj, protocol.Rejection)
    assert rj.reason == "model 'pool-0': array 'w' has shape (3, 3), expected (2, 3)"
    nan = protocol.train_reply(instr, model(2.0), 10, {}, models={"p": model(float("nan"))})
    assert "NaN" in protocol.parse_train_reply(nan, sent(instr), {5: 1}, None).reason


def test_trainer_state_round_trips_per_scope_and_forgets_what_is_gone():
    box = RecordDict()
    protocol.state_to_records({"rounds": 3, "note": "x", "last": model(5.0)}, box, "fedavg/sgd")
    protocol.state_to_records({"rounds": 1}, box, "fedprox/fedprox")
    got = protocol.state_from_records(box, "fedavg/sgd")
    assert got["rounds"] == 3 and got["note"] == "x" and np.all(got["last"]["w"] == 5.0)
    assert protocol.state_from_records(box, "fedprox/fedprox") == {"rounds": 1}
    assert protocol.state_from_records(box, "other/sgd") == {}
    protocol.state_to_records({"rounds": 4}, box, "fedavg/sgd")
    assert protocol.state_from_records(box, "fedavg/sgd") == {"rounds": 4}
    with pytest.raises(TypeError, match="trainer state 'opt' is a dict"):
        protocol.state_to_records({"opt": {"lr": 0.1}}, box, "fedavg/sgd")
    assert protocol.state_from_records(box, "fedavg/sgd") == {"rounds": 4}  # nothing lost
