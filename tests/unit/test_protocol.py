"""The message protocol: typed settings, named extra models both ways, trainer state."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from flwr.app import MessageType, RecordDict

from fedsys import protocol, trainer_state, transport, validation


def model(v: float = 0.0) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), v, np.float32), "n": np.array(7, dtype=np.int64)}


def sent(m):
    m.metadata.__dict__["_message_id"] = "m1"
    return {"m1": m}


def parse(reply, sent_map, expected, arrays_key: str = "arrays"):
    """Steps 1-3 of the reply pipeline for one reply (strategies.replies.judge_reply)."""
    from strategies.replies import ReplyPolicy, RoundView, judge_reply

    policy = ReplyPolicy("test", "num-examples", "loss", 0.0, 0.0, 0.0, {}, lambda *a: None,
                         arrays_key=arrays_key)
    rnd = RoundView(sent_map, expected, {})
    return judge_reply(reply, rnd, policy, rnd.reported)[0]


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
    sent(instr)  # the runtime gives the instruction its id before anyone replies
    ok = protocol.train_reply(instr, model(2.0), 10, {"train-loss": 0.3},
                              models={"pool-0": model(3.0), "pool-1": model(4.0)})
    upd = parse(ok, sent(instr), {5: 1})
    assert isinstance(upd, validation.ClientUpdate)
    assert upd.partition_id == 1 and upd.num_examples == 10 and sorted(upd.models) == ["pool-0",
                                                                                       "pool-1"]
    bad_pool = {"w": np.zeros((3, 3), np.float32), "n": np.array(7, dtype=np.int64)}
    bad = protocol.train_reply(instr, model(2.0), 10, {}, models={"pool-0": bad_pool})
    rj = parse(bad, sent(instr), {5: 1})
    assert isinstance(rj, validation.Rejection)
    assert rj.reason == "model 'pool-0': array 'w' has shape (3, 3), expected (2, 3)"
    nan = protocol.train_reply(instr, model(2.0), 10, {}, models={"p": model(float("nan"))})
    assert "NaN" in parse(nan, sent(instr), {5: 1}).reason
    work = protocol.train_reply(instr, model(2.0), 10, {"trained-examples": -30})
    assert parse(work, sent(instr), {5: 1}).reason == \
        "trained-examples is -30"


def test_trainer_state_round_trips_per_scope_and_forgets_what_is_gone():
    box = RecordDict()
    trainer_state.state_to_records({"rounds": 3, "note": "x", "last": model(5.0)}, box, "fedavg/sgd")
    trainer_state.state_to_records({"rounds": 1}, box, "fedprox/fedprox")
    got = trainer_state.state_from_records(box, "fedavg/sgd")
    assert got["rounds"] == 3 and got["note"] == "x" and np.all(got["last"]["w"] == 5.0)
    assert trainer_state.state_from_records(box, "fedprox/fedprox") == {"rounds": 1}
    assert trainer_state.state_from_records(box, "other/sgd") == {}
    trainer_state.state_to_records({"rounds": 4}, box, "fedavg/sgd")
    assert trainer_state.state_from_records(box, "fedavg/sgd") == {"rounds": 4}
    with pytest.raises(TypeError, match="trainer state 'opt' is a dict"):
        trainer_state.state_to_records({"opt": {"lr": 0.1}}, box, "fedavg/sgd")
    assert trainer_state.state_from_records(box, "fedavg/sgd") == {"rounds": 4}  # nothing lost


def _reply(instr, records: dict) -> object:
    from flwr.app import Message

    return Message(RecordDict(records), reply_to=instr)


@pytest.mark.parametrize(("records", "why"), [
    ({"arrays": "M", "extra": "M", "metrics": {"num-examples": 10}},
     "unexpected ArrayRecord(s) ['extra']"),
    ({"arrays": "M", "metrics": {"num-examples": 10}, "other": {"x": 1.0}},
     "more than one MetricRecord ['metrics', 'other']"),
    ({"one": "M", "two": "M", "metrics": {"num-examples": 10}},
     "unexpected ArrayRecord(s) ['one', 'two']"),
    ({"model.pool-0": "M", "metrics": {"num-examples": 10}}, "no ArrayRecord 'arrays'"),
    ({"arrays": "M", "metrics": {"x": 1.0}}, "lack 'num-examples'"),
    # the numbers in a ConfigRecord, as a legacy client might send them
    ({"arrays": "M", "metrics": "N"}, "no MetricRecord ('num-examples' is in ConfigRecord 'metrics'"),
    ({"arrays": "M", "metrics": {"num-examples": 10, "loss": [0.1, 0.2]}},
     "metric(s) ['loss'] are not numbers"),
    ({"arrays": "M", "metrics": {"num-examples": 10.5}}, "not a whole number"),
    ({"arrays": "M", "metrics": {"num-examples": 0}}, "num-examples is 0"),
    ({"arrays": "M", "metrics": {"num-examples": -3}}, "num-examples is -3"),
    ({"arrays": "M", "metrics": {"train-loss": 1.0}}, "lack 'num-examples'"),
    ({"metrics": {"num-examples": 10}}, "no ArrayRecord 'arrays'"),
])
def test_a_reply_that_is_not_exactly_what_is_expected_is_refused_naming_why(records, why):
    from flwr.app import ConfigRecord, MetricRecord

    instr = protocol.message(5, MessageType.TRAIN, model(1.0), {})
    sent(instr)
    built = {}
    for k, v in records.items():
        if v == "M":
            built[k] = protocol.to_record(model(2.0))
        elif v == "C":
            built[k] = ConfigRecord({"note": "x"})
        elif v == "N":
            built[k] = ConfigRecord({"num-examples": 10})
        else:
            built[k] = MetricRecord(v)
    rj = parse(_reply(instr, built), sent(instr), {5: 1})
    assert isinstance(rj, validation.Rejection) and why in rj.reason, getattr(rj, "reason", rj)


def _built(records: dict) -> RecordDict:
    from flwr.app import ConfigRecord, MetricRecord

    return RecordDict({k: protocol.to_record(model(2.0)) if v == "M" else
                       ConfigRecord({"meta": b"x", "note": "x"}) if v == "C" else MetricRecord(v)
                       for k, v in records.items()})


@pytest.mark.parametrize("records", [
    # Flower's tutorial "Communicate custom Messages": an object in a ConfigRecord beside
    # the model and the metrics, which the strategy leaves alone
    {"arrays": "M", "metrics": {"num-examples": 10, "training_time": 1.5}, "train_metadata": "C"},
    # Flower's strategies take a reply's one ArrayRecord and one MetricRecord by any name
    {"model": "M", "train_metrics": {"num-examples": 10}},
    {"weights": "M", "model.pool-0": "M", "m": {"num-examples": 10}},
])
def test_a_reply_as_flowers_strategies_read_it_is_used(records):
    instr = protocol.message(5, MessageType.TRAIN, model(1.0), {})
    sent(instr)
    upd = parse(_reply(instr, _built(records)), sent(instr), {5: 1})
    assert isinstance(upd, validation.ClientUpdate), upd
    assert upd.num_examples == 10 and np.all(upd.params["w"] == 2.0)


def test_a_strategys_record_names_name_the_instruction_and_its_reply():
    instr = protocol.message(5, MessageType.TRAIN, model(1.0), {"lr": 0.1},
                             arrays_key="weights", config_key="settings")
    sent(instr)
    assert sorted(instr.content.array_records) == ["weights"]
    assert sorted(instr.content.config_records) == ["settings"]
    assert protocol.settings(instr.content, "settings") == {"lr": 0.1}
    assert protocol.settings(instr.content) == {"lr": 0.1}  # its one ConfigRecord
    assert np.all(protocol.model_record(instr.content).to_numpy_ndarrays()[0] == 1.0)
    # a reply naming the model as sent; the sent model is the update's yardstick
    ok = _reply(instr, _built({"weights": "M", "metrics": {"num-examples": 10}}))
    assert isinstance(parse(ok, sent(instr), {5: 1}, arrays_key="weights"), validation.ClientUpdate)
    short = RecordDict({"weights": protocol.to_record({"w": np.zeros((2, 2), np.float32)}),
                        "metrics": _built({"m": {"num-examples": 10}})["m"]})
    rj = parse(_reply(instr, short), sent(instr), {5: 1}, arrays_key="weights")
    assert isinstance(rj, validation.Rejection) and "array 'w' has shape (2, 2)" in rj.reason, rj
    both = _reply(instr, _built({"weights": "M", "arrays": "M", "metrics": {"num-examples": 10}}))
    rj = parse(both, sent(instr), {5: 1}, arrays_key="weights")
    assert isinstance(rj, validation.Rejection) and "unexpected ArrayRecord(s) ['arrays']" in rj.reason
    with pytest.raises(KeyError, match="no model ArrayRecord 'arrays'"):
        protocol.model_record(_built({"a": "M", "b": "M"}))


def test_a_reply_to_another_message_is_refused():
    instr = protocol.message(5, MessageType.TRAIN, model(1.0), {})
    sent(instr)
    other = protocol.message(5, MessageType.TRAIN, model(1.0), {})
    other.metadata.__dict__["_message_id"] = "elsewhere"
    stray = protocol.train_reply(other, model(2.0), 10, {})
    rj = parse(stray, sent(instr), {5: 1})
    assert isinstance(rj, validation.Rejection) and "did not send" in rj.reason



class FakeClock:
    """``time.monotonic`` and ``time.sleep`` of :mod:`fedsys.protocol` on a clock that moves
    only when slept: a wait is asserted as the seconds asked for, not measured."""

    def __init__(self) -> None:
        self.now, self.waits = 1000.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(transport, "time", SimpleNamespace(monotonic=fake.monotonic,
                                                          sleep=fake.sleep))
    return fake


def _status(code: int) -> httpx.HTTPStatusError:
    req = httpx.Request("POST", "http://127.0.0.1:1/v1/runtime/pull-messages")
    return httpx.HTTPStatusError(f"{code}", request=req, response=httpx.Response(code,
                                                                                 request=req))


def test_a_superlink_5xx_or_dropped_connection_is_tried_again_and_logged(caplog):
    failures = [_status(500), httpx.ConnectError("refused"), _status(503)]
    calls = []

    def pull():
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return ["reply"]

    with caplog.at_level(logging.WARNING, logger="flwr"):
        got = transport.retry_transient(pull, "pull-messages", time.monotonic() + 30,
                                       first_wait=0.01)
    assert got == ["reply"] and len(calls) == 4
    warned = [r.getMessage() for r in caplog.records if "pull-messages failed" in r.getMessage()]
    assert len(warned) == 3 and "attempt 1" in warned[0] and "500" in warned[0]


@pytest.mark.parametrize("exc", [_status(404), ValueError("a bug, not the network")])
def test_an_answer_or_a_bug_is_raised_at_once(exc):
    calls = []

    def pull():
        calls.append(1)
        raise exc

    with pytest.raises(type(exc)):
        transport.retry_transient(pull, "pull-messages", time.monotonic() + 30, first_wait=0.01)
    assert len(calls) == 1


def test_a_failure_that_outlasts_the_deadline_is_raised(clock):
    calls = []

    def pull():
        calls.append(1)
        raise _status(500)

    with pytest.raises(httpx.HTTPStatusError):
        transport.retry_transient(pull, "pull-messages", clock.now + 0.3, first_wait=0.05)
    # waits 0.05, 0.1, then the 0.15 s left: 4 tries, the last at the deadline
    assert len(calls) == 4 and sum(clock.waits) == pytest.approx(0.3)


class _SlowLink:
    """A grid whose one reply is ready ``after`` seconds of the fake clock; counts the pulls."""

    def __init__(self, clock: FakeClock, after: float) -> None:
        self.clock, self.ready, self.pulls = clock, clock.now + after, 0

    def push_messages(self, messages):
        return ["m1"]

    def pull_messages(self, ids):
        self.pulls += 1
        if self.clock.now < self.ready:
            return []
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id="m1"))]


def test_polling_a_superlink_backs_off_but_sees_a_late_reply_soon(clock):
    link = _SlowLink(clock, 3.0)
    t0 = clock.now
    replies, sent = transport.send_and_receive(link, ["instruction"], timeout=30, poll=0.05)
    assert len(replies) == 1 and list(sent) == ["m1"]
    # every 0.05 s would be 60 pulls; a wait of a tenth of the time waited makes about
    # 10 (the first 0.5 s) + 10 ln(3 / 0.5) = 28
    assert link.pulls <= 35
    assert clock.now - t0 < 3.0 * 1.1 + 0.05  # seen at most a tenth late


def test_a_reply_that_arrives_in_the_last_wait_before_the_deadline_is_taken(clock):
    """Pulls every 0.4 s find nothing at 0, 0.4 and 0.8 s; the next wait would wake at
    1.2 s, after the deadline.  It is cut to end at 1.0 s and a pull follows, so the reply
    ready at 0.9 s is taken (before: refused, the loop woke at 1.2 s and gave up)."""
    link = _SlowLink(clock, 0.9)
    t0 = clock.now
    replies, _ = transport.send_and_receive(link, ["instruction"], timeout=1.0, poll=0.4,
                                           max_poll=0.4)
    assert len(replies) == 1
    assert clock.now - t0 == pytest.approx(1.0)


def test_no_reply_the_round_ends_at_the_deadline_after_a_last_pull(clock):
    link = _SlowLink(clock, 60.0)
    t0 = clock.now
    replies, sent = transport.send_and_receive(link, ["instruction"], timeout=0.5, poll=0.05)
    assert replies == [] and list(sent) == ["m1"]
    assert clock.now - t0 == pytest.approx(0.5) and link.pulls >= 3


class InMemoryGrid(_SlowLink):
    """Named as Flower's simulation grid (:func:`transport.in_process` goes by the name)."""


@pytest.mark.parametrize("kind, first, longest", [
    (_SlowLink, 0.1, 0.5), (InMemoryGrid, 0.01, 0.05)])
def test_polling_a_superlink_in_this_process_waits_less(clock, kind, first, longest):
    """A remote SuperLink is pulled after 0.1 s, then less often (up to 0.5 s); one in this
    process (the simulation engine) after 0.01 s and never more than 0.05 s apart."""
    link = kind(clock, 60.0)
    transport.send_and_receive(link, ["instruction"], timeout=20.0)
    assert transport.in_process(link) == (kind is InMemoryGrid)
    assert clock.waits[0] == pytest.approx(first)
    assert max(clock.waits) == pytest.approx(longest)
