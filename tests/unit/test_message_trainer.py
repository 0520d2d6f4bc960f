"""A fedsys trainer in a Flower Message-API ClientApp of your own (``clients.message``): the
same training as fedsys's own ClientApp, bit for bit; the reply in Flower's names, read by
Flower's own FedAvg; the trainer the strategy asks for; options, state and errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp.strategy import FedAvg

from clients import TRAINERS, LocalConfig, Trainer, TrainJob, TrainResult
from clients.base import sgd_loop
from clients.fedprox import FedProxTrainer
from clients.message import chosen_trainer, local_evaluate, local_train
from fedsys import protocol as proto
from fedsys import task
from fedsys.params import from_torch
from fedsys_launch.apps import client_app
from fedsys_launch.config_schema import build

CFG = build({"dataset": "synthetic", "model": "mlp", "num-clients": 3, "clients-per-round": 3,
             "partition": "iid", "local-steps": 3, "batch-size": 16, "lr": 0.05,
             "momentum": 0.9, "fedelmy.pool-size": 2, "lss.ingredients": 2, "seed": 4})
LOCAL = LocalConfig(max_steps=3, batch_size=16, lr=0.05, momentum=0.9)
OPTIONS = {"fedelmy.pool-size": 2, "lss.ingredients": 2}
PID = 1


def _context(state: RecordDict | None = None) -> Context:
    return Context(run_id=1, node_id=100 + PID,
                   node_config={proto.PARTITION_ID: PID, proto.NUM_PARTITIONS: 3},
                   state=RecordDict() if state is None else state,
                   run_config=dict(CFG.to_dict()))


def _message(config: dict[str, Any], kind: str = "train") -> Message:
    net = task.model(CFG.replace(seed=7))
    msg = proto.message(100 + PID, kind, from_torch(net.state_dict()), config)
    msg.metadata.__dict__["_message_id"] = f"{kind}-{sorted(config.items())}"
    return msg


def _data() -> tuple[torch.Tensor, torch.Tensor, Any]:
    ds = task.dataset(CFG)
    x, y = task.client_data(CFG, PID, 3)
    return x, y, ds.normalise


def _ours(msg: Message, trainer: Any = None, **kw: Any) -> Message:
    x, y, normalise = _data()
    kw = {"options": OPTIONS, "local": LOCAL, "seed": CFG.seed, "partition_id": PID, **kw}
    return local_train(msg, kw.pop("context", _context()), task.model(CFG.replace(seed=1)),
                       x, y, normalise, trainer, **kw)


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_the_same_training_as_fedsys_own_client_app_bit_for_bit(trainer):
    """Your model and data through ``local_train`` train as fedsys's ClientApp trains them:
    equal weights and metrics (Flower's ``train_loss`` for fedsys's ``train-loss``)."""
    config = {proto.SERVER_ROUND: 3, proto.TRAINER: trainer, proto.STATE_SCOPE: "s"}
    theirs = client_app.app(_message(config), _context())
    mine = _ours(_message(config))
    a = theirs.content[proto.ARRAYS].to_torch_state_dict()
    b = mine.content[proto.ARRAYS].to_torch_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma, mb = dict(theirs.content[proto.METRICS]), dict(mine.content[proto.METRICS])
    assert mb.pop(proto.FLOWER_TRAIN_LOSS) == ma.pop(proto.TRAIN_LOSS)
    assert ma == mb and mb[proto.PARTITION_ID] == PID
    assert sorted(mine.content.array_records) == sorted(theirs.content.array_records)
    sent = _message(config).content[proto.ARRAYS].to_torch_state_dict()
    assert any(not torch.equal(b[k], sent[k]) for k in b), "it trained nothing"


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_your_own_random_numbers_are_yours_after_a_fedsys_trainer(trainer):
    """The trainers seed torch's global generator; the caller's stream goes on after
    ``local_train`` as if it had not run (and the training is the same either way)."""
    config = {proto.SERVER_ROUND: 2, proto.TRAINER: trainer}
    torch.manual_seed(123)
    torch.rand(3)
    expected = torch.rand(5)
    torch.manual_seed(123)
    torch.rand(3)
    first = _ours(_message(config))
    assert torch.equal(torch.rand(5), expected), "local_train moved the caller's generator"
    torch.manual_seed(999)
    again = _ours(_message(config)).content[proto.ARRAYS].to_torch_state_dict()
    a = first.content[proto.ARRAYS].to_torch_state_dict()
    assert all(torch.equal(a[k], again[k]) for k in a), "training drew on the caller's state"


def test_the_reply_is_what_flowers_own_fedavg_aggregates():
    """Flower's FedAvg (``flwr.serverapp.strategy``) sends ``lr`` and ``server-round`` only:
    the reply is read as its template's client reply is."""
    replies = [_ours(_message({"lr": 0.05, proto.SERVER_ROUND: 1}), "lss") for _ in range(2)]
    assert all(sorted(r.content.keys()) == ["arrays", "metrics"] for r in replies)
    arrays, metrics = FedAvg().aggregate_train(1, replies)
    assert arrays is not None and metrics is not None and "train_loss" in metrics
    mean = replies[0].content["arrays"].to_torch_state_dict()  # equal replies: their mean
    got = arrays.to_torch_state_dict()
    assert all(torch.allclose(got[k], mean[k]) for k in mean)


def test_the_trainer_is_the_callers_else_the_strategys_else_flowers_fedprox_else_sgd():
    assert chosen_trainer("lss", {proto.TRAINER: "fedelmy"})[0] is TRAINERS["lss"]
    assert chosen_trainer(None, {proto.TRAINER: "fedelmy"}) == (TRAINERS["fedelmy"], {})
    assert chosen_trainer(None, {proto.PROXIMAL_MU: 0.3}) == (FedProxTrainer, {"fedprox.mu": 0.3})
    assert chosen_trainer(None, {"lr": 0.1}) == (TRAINERS["sgd"], {})
    with pytest.raises(ValueError, match="unknown trainer 'soup'; registered: sgd"):
        chosen_trainer(None, {proto.TRAINER: "soup"})


def test_flowers_fedprox_mu_reaches_the_proximal_term():
    """Flower's FedProx sends ``proximal-mu``: a large mu keeps the model nearer the sent
    one than mu 0 does (the same batches otherwise)."""
    sent = _message({}).content[proto.ARRAYS].to_torch_state_dict()

    def moved(mu: float) -> float:
        reply = _ours(_message({proto.SERVER_ROUND: 2, proto.PROXIMAL_MU: mu}),
                      local=LocalConfig(max_steps=20, batch_size=16, lr=0.1))
        got = reply.content[proto.ARRAYS].to_torch_state_dict()
        return float(sum(torch.sum((got[k] - sent[k]) ** 2) for k in sent))

    assert moved(5.0) < 0.5 * moved(0.0)  # lr x mu = 0.5: pulled back, stable


def test_the_rounds_config_overrides_the_callers_options_and_settings():
    base = _ours(_message({proto.SERVER_ROUND: 1}), "lss")
    more = _ours(_message({proto.SERVER_ROUND: 1, "lss.ingredients": 3, "local-steps": 5}), "lss")
    assert base.content[proto.METRICS]["soup-size"] == 3  # 2 ingredients and the anchor
    assert more.content[proto.METRICS]["soup-size"] == 4
    assert more.content[proto.METRICS][proto.LOCAL_STEPS] > base.content[proto.METRICS][proto.LOCAL_STEPS]


def test_same_round_same_weights_another_round_other_batches():
    def weights(rnd: int) -> dict[str, torch.Tensor]:
        return _ours(_message({proto.SERVER_ROUND: rnd}), "sgd").content[proto.ARRAYS] \
            .to_torch_state_dict()

    a, b, c = weights(1), weights(1), weights(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


class Counting(Trainer):
    """A trainer of your own whose state counts its rounds (docs/extending.md)."""

    name = "counting"

    def train(self, job: TrainJob) -> TrainResult:
        res = sgd_loop(job.net, job.x, job.y, job.normalise, job.config)
        res.state = {"rounds": int(job.state.get("rounds", 0)) + 1}
        res.metrics["rounds"] = res.state["rounds"]
        return res


def test_a_trainers_state_lasts_in_context_state_between_rounds():
    state = RecordDict()
    for rnd in (1, 2, 3):
        reply = _ours(_message({proto.SERVER_ROUND: rnd}), Counting, context=_context(state))
        assert reply.content[proto.METRICS]["rounds"] == rnd
    assert any(isinstance(r, ConfigRecord) for r in state.values())


def test_a_wrong_option_is_one_error_naming_it():
    with pytest.raises(ValueError, match=r"trainer 'lss': unknown config key 'lss\.ingredient'"):
        _ours(_message({proto.SERVER_ROUND: 1}), "lss", options={"lss.ingredient": 2})
    with pytest.raises(ValueError, match=r"lss\.ingredients"):
        _ours(_message({proto.SERVER_ROUND: 1, "lss.ingredients": 0}), "lss")


def test_without_a_partition_id_the_node_id_seeds_and_none_is_reported():
    x, y, normalise = _data()
    msg = _message({proto.SERVER_ROUND: 1})
    reply = local_train(msg, _context(), task.model(CFG), x, y, normalise, "sgd", local=LOCAL,
                        seed=CFG.seed)
    assert proto.PARTITION_ID not in reply.content[proto.METRICS]
    again = local_train(msg, _context(), task.model(CFG), x, y, normalise, "sgd", local=LOCAL,
                        seed=CFG.seed)
    a, b = (r.content[proto.ARRAYS].to_torch_state_dict() for r in (reply, again))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_local_evaluate_replies_in_flowers_names():
    x, y, normalise = _data()
    msg = _message({}, "evaluate")
    reply = local_evaluate(msg, task.model(CFG), x, y, normalise)
    m = dict(reply.content["metrics"])
    assert sorted(m) == ["eval_acc", "eval_loss", "num-examples"] and m["num-examples"] == len(y)
    loss, acc = task.score(_loaded(msg), normalise, x, y, 256, torch.device("cpu"))
    assert m["eval_loss"] == pytest.approx(loss) and m["eval_acc"] == pytest.approx(acc)
    assert 0 <= m["eval_acc"] <= 1 and np.isfinite(m["eval_loss"])


def _loaded(msg: Message) -> torch.nn.Module:
    net = task.model(CFG)
    net.load_state_dict(msg.content[proto.ARRAYS].to_torch_state_dict())
    return net
