"""The NumPyClient adapter's fit and evaluate against the trainer called directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients import TRAINERS, LocalConfig, TrainJob
from clients.base import local_config
from clients.numpy_client import TrainerClient
from fedsys.options import ConfigError, parse_group
from fedsys.seeding import derive_seed
from fedsys.task import score


def _setup():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 8), torch.nn.ReLU(),
                              torch.nn.Linear(8, 3))
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 255, (64, 1, 3, 4), generator=g, dtype=torch.uint8)
    y = (x.float().mean((1, 2, 3)) > 127).long()
    return net, x, y, (lambda b: b.float() / 255)


@pytest.mark.parametrize("trainer", ["sgd", "lss", "fedelmy"])
def test_fit_equals_the_trainer_called_directly(trainer):
    net, x, y, norm = _setup()
    start = [v.detach().numpy().copy() for v in net.state_dict().values()]
    options = {"lss.ingredients": 2, "lss.affinity": 0.1, "fedelmy.pool-size": 2}
    local = LocalConfig(epochs=1, batch_size=16, lr=0.01)
    client = TrainerClient(net, x, y, norm, trainer, options=options, local=local, seed=7,
                           partition_id=2)
    config = {"server-round": 3, "lr": 0.02, "local-epochs": 2}
    arrays, n, metrics = client.fit(start, config)

    ref, _, _, _ = _setup()
    tcls = TRAINERS[trainer]
    opts = parse_group(tcls.Options, tcls.prefix(), {k: v for k, v in options.items()
                                               if k.startswith(tcls.prefix() + ".")})
    cfg = local_config(config, local, derive_seed(7, 3, 2))
    assert cfg.lr == 0.02 and cfg.epochs == 2  # the round's config wins
    res = tcls().train(TrainJob(ref, x, y, norm, cfg, opts, server_round=3, partition_id=2,
                             run_seed=7))
    want = [v.detach().numpy() for v in ref.state_dict().values()]
    assert all(np.array_equal(a, b) for a, b in zip(arrays, want, strict=True))
    assert n == res.num_examples and metrics["train-loss"] == res.train_loss
    assert all(metrics[k] == v for k, v in res.metrics.items())


def test_evaluate_scores_the_local_split_and_bad_input_is_refused():
    net, x, y, norm = _setup()
    client = TrainerClient(net, x, y, norm, "sgd", x_eval=x[:20], y_eval=y[:20])
    params = client.get_parameters({})
    loss, n, m = client.evaluate(params, {})
    want = score(net, norm, x[:20], y[:20], 256, torch.device("cpu"))
    assert n == 20 and (loss, m["accuracy"]) == want
    with pytest.raises(ValueError, match="received 3 arrays, the model has 4"):
        client.fit(params[:3], {})
    with pytest.raises(ConfigError, match=r"lss\.ingredients"):
        TrainerClient(net, x, y, norm, "lss", options={"lss.ingredients": 0})
    with pytest.raises(ValueError, match="unknown trainer 'soup'"):
        TrainerClient(net, x, y, norm, "soup")
