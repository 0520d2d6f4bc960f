"""The fedsys ClientApp keeps each client's samples and the built model across messages (a
simulation actor serves many clients and rounds): a reply must not depend on what the
process handled before it, bit for bit."""

from __future__ import annotations

import pytest
import torch
from flwr.app import Context, Message, RecordDict

from clients import TRAINERS
from fedsys import protocol as proto
from fedsys import task
from fedsys.params import Params, from_torch
from fedsys_launch.apps import client_app, node_model
from fedsys_launch.config_schema import build

CFG = build({"dataset": "synthetic", "model": "mlp", "num-clients": 3, "clients-per-round": 3,
             "partition": "iid", "local-steps": 3, "batch-size": 16, "lr": 0.05,
             "momentum": 0.9, "fedelmy.pool-size": 2, "lss.ingredients": 2})


def _weights(seed: int) -> Params:
    net = task.model(CFG.replace(seed=seed))
    return from_torch(net.state_dict())


def _context(pid: int) -> Context:
    return Context(run_id=1, node_id=100 + pid,
                   node_config={proto.PARTITION_ID: pid, proto.NUM_PARTITIONS: 3},
                   state=RecordDict(), run_config=dict(CFG.to_dict()))


def _message(kind: str, pid: int, weights: Params, trainer: str = "sgd") -> Message:
    msg = proto.message(100 + pid, kind, weights,
                        {proto.SERVER_ROUND: 2, proto.TRAINER: trainer,
                         proto.STATE_SCOPE: "test"})
    msg.metadata.__dict__["_message_id"] = f"{kind}-{pid}-{trainer}"  # as the SuperLink sets it
    return msg


def _fresh_process() -> None:
    node_model.built_model.cache_clear()
    task._client_data.cache_clear()


def _reply(reply: Message) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    content = reply.content
    return dict(content.array_records[proto.ARRAYS].to_torch_state_dict()), dict(content.metric_records[proto.METRICS])


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_a_reply_is_the_same_after_other_messages_as_in_a_fresh_process(trainer):
    """Fresh: one train message in a process that handled nothing.  Warm: the same message
    after an evaluation (which leaves the model in eval mode), a training of another client
    with other weights by every trainer (LSS sets parameters as views of its vectors,
    FedELMY keeps a pool) and a query."""
    target = _message("train", 1, _weights(7), trainer)
    _fresh_process()
    fresh = _reply(client_app.app(target, _context(1)))

    _fresh_process()
    client_app.app(_message("evaluate", 0, _weights(3)), _context(0))
    for other in ("lss", "fedelmy", "sgd"):
        client_app.app(_message("train", 0, _weights(5), other), _context(0))
    client_app.app(proto.query_message(102), _context(2))
    warm = _reply(client_app.app(target, _context(1)))

    assert fresh[0].keys() == warm[0].keys()
    for k in fresh[0]:
        assert torch.equal(fresh[0][k], warm[0][k]), k
    assert fresh[1] == warm[1]
    sent = _weights(7)
    assert any(not torch.equal(fresh[0][k], torch.from_numpy(sent[k])) for k in sent), \
        "the message trained nothing"


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_no_trainer_writes_into_the_clients_samples(trainer):
    """The samples are shared between messages (:func:`fedsys.task.client_data` selects a
    client's once per process): training must leave them as they were."""
    _fresh_process()
    x, y = task.client_data(CFG, 1, 3)
    x0, y0 = x.clone(), y.clone()
    client_app.app(_message("train", 1, _weights(7), trainer), _context(1))
    assert task.client_data(CFG, 1, 3)[0] is x and torch.equal(x, x0) and torch.equal(y, y0)


def test_the_kept_model_comes_back_as_a_fresh_one_would():
    """Training mode (an evaluation left it in eval mode) and no gradients (a training left
    them), with every parameter and buffer the message's."""
    _fresh_process()
    ds = task.dataset(CFG)
    first = node_model.load_model(CFG, ds, _message("train", 0, _weights(5)))
    first.eval()
    sum(p.sum() for p in first.parameters()).backward()
    again = node_model.load_model(CFG, ds, _message("train", 0, _weights(7)))
    assert again is first and again.training
    assert all(p.grad is None for p in again.parameters())
    want = _weights(7)
    assert all(torch.equal(v, torch.from_numpy(want[k])) for k, v in again.state_dict().items())


def test_a_site_with_its_own_data_trains_on_all_of_it(tmp_path):
    """A node config with a ``data-dir`` and no ``num-partitions`` (``fedsys deploy add-site
    --data-dir``): the site's whole dataset, its partition-id only its identity; with
    ``num-partitions`` the same directory is split as in simulation."""
    import numpy as np

    rng = np.random.default_rng(0)
    for part, n in (("train", 60), ("test", 20)):
        np.savez(tmp_path / f"{part}.npz", x=rng.integers(0, 255, (n, 8, 8), dtype=np.uint8),
                 y=np.arange(n) % 3)
    cfg = build({"dataset": "custom", "model": "mlp", "num-clients": 3,
                 "clients-per-round": 3, "partition": "iid", "data-dir": "/server/only"})

    def declared(node_config: dict[str, object]) -> dict[str, float]:
        _fresh_process()
        ctx = Context(run_id=1, node_id=105, node_config=node_config, state=RecordDict(),
                      run_config=dict(cfg.to_dict()))
        reply = client_app.app(proto.query_message(105), ctx)
        return dict(reply.content.metric_records[proto.METRICS])

    own = declared({proto.PARTITION_ID: 5, "data-dir": str(tmp_path)})
    assert own[proto.PARTITION_ID] == 5 and own[proto.NUM_EXAMPLES] == 60
    split = declared({proto.PARTITION_ID: 1, proto.NUM_PARTITIONS: 2, "data-dir": str(tmp_path)})
    assert split[proto.NUM_EXAMPLES] == 30
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        declared({proto.PARTITION_ID: 5, proto.NUM_PARTITIONS: 2, "data-dir": str(tmp_path)})
