"""FedELMY's default objective is the paper's (App. A): d1 and d2 divided by the
magnitude factor, one decade below the loss.  Golden tests on the spec's worked examples
(``fedelmy.md`` §2.2) through the trainer's own regulariser with default options, and a
seconds-long check on real Fashion-MNIST that a default pool model is not pinned to the
received model (issue 39: unscaled, ``beta * ||theta - m0||`` has a gradient of norm
``beta`` at any distance and holds every pool model near ``m_0``)."""

from __future__ import annotations

import math

import pytest
import torch

from clients.base import LocalConfig, TrainJob
from clients.fedelmy import (
    FedElmyOptions,
    FedElmyTrainer,
    FedSeqTrainer,
    Regulariser,
)
from fedsys import pool as pool_ops
from fedsys.fedelmy import HELD_RATIO, POOL_HELD
from fedsys.options import parse_group


def _at_distance(m0: torch.Tensor, d: float, seed: int) -> torch.Tensor:
    """A point at L2 distance ``d`` from ``m0`` in a seeded direction."""
    u = torch.randn(m0.shape, generator=torch.Generator().manual_seed(seed), dtype=m0.dtype)
    return m0 + d * u / torch.linalg.vector_norm(u)


@pytest.mark.parametrize(("loss", "d2", "s"), [(6.02, 45.0, 100.0), (2.3, 1234.0, 1e4),
                                               (0.05, 3.0, 1000.0)])
def test_the_default_objective_scales_d1_and_d2_one_decade_below_the_loss(loss, d2, s):
    """Spec §2.2's checks, through the trainer's regulariser built from the defaults:
    the gradient added is that of ``(-alpha d1 + beta d2) / s`` with ``s = SCALE(loss,
    d2)``, and ``d2 / s`` lies one decade below the loss."""
    o = FedElmyOptions()
    assert o.form == "paper" and o.scaling is True
    m0 = torch.randn(11, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    member = _at_distance(m0, 3.0, 1)
    theta = _at_distance(m0, d2, 2)
    param = torch.nn.Parameter(theta.clone())
    param.grad = torch.zeros_like(theta)
    reg = Regulariser(o.form, o.scaling, o.alpha, o.beta, m0, m0, [m0, member])
    reg.after_backward([param], torch.tensor(loss))
    assert reg.logs["scale"] == s
    assert math.isclose(reg.logs["d2"], d2, rel_tol=1e-9)
    scaled = reg.logs["d2"] / reg.logs["scale"]
    o_l = math.floor(math.log10(loss))
    assert 10 ** (o_l - 1) <= scaled * (1 + 1e-12) < 10 ** o_l
    # autograd of Eqs. 7-9 with d1, d2 divided by s: the same gradient
    t = theta.clone().requires_grad_(True)
    d1_t, d2_t = pool_ops.distances(t, [m0, member], m0)
    ((-o.alpha * d1_t + o.beta * d2_t) / s).backward()
    assert t.grad is not None and torch.allclose(param.grad, t.grad)
    # the unscaled ablation adds the gradient s times larger
    off = torch.nn.Parameter(theta.clone())
    off.grad = torch.zeros_like(theta)
    Regulariser(o.form, False, o.alpha, o.beta, m0, m0, [m0, member]).after_backward(
        [off], torch.tensor(loss))
    assert torch.allclose(off.grad, s * t.grad)


def test_a_default_pool_model_moves_away_from_the_received_model():
    """After a FedSeq warm-up epoch on 2,000 real training images (16 steps of 128), one
    pool model of 16 Adam steps with default options moves at least a quarter as far from
    ``m_0`` as an unregularised one (alpha = beta = 0); the unscaled Eq. 9 holds it within
    a tenth, so this fails on the old default.  Measured (2026-11-27, CPU): default 1.37, unscaled 0.36, unregularised 4.72.
    The issue's "a third" is not reached with App. A's rule itself: 0.17-0.29 across the
    client sizes tried (1,000-4,742 samples), against 0.01-0.17 unscaled."""
    from fedsys.data import load_fashion_mnist
    from fedsys.models import build_model

    ds = load_fashion_mnist()
    idx = torch.randperm(len(ds.y_train), generator=torch.Generator().manual_seed(0))[:2000]
    x, y = ds.x_train[idx], ds.y_train[idx]
    cfg = LocalConfig(epochs=1, batch_size=128, lr=1e-3, weight_decay=1e-4, seed=1,
                      optimizer="adam")
    net = build_model("fmnist-cnn", ds.input_shape, ds.num_classes, 0, "bn")
    FedSeqTrainer().train(TrainJob(net, x, y, ds.normalise, cfg,
                                   parse_group(FedSeqTrainer.Options, "fedseq", {}), run_seed=0))
    warm = {k: v.clone() for k, v in net.state_dict().items()}
    m0 = pool_ops.trainable_vector(net).clone()

    def moved(**opts: object) -> float:
        net.load_state_dict(warm)
        o = parse_group(FedElmyOptions, "fedelmy", {"pool-size": 1, "select-best": False, **opts})
        FedElmyTrainer().train(TrainJob(net, x, y, ds.normalise, cfg, o, run_seed=0))
        # the reply is (m_0 + m_1) / 2: the pool model is twice as far from m_0
        return 2 * float(torch.dist(pool_ops.trainable_vector(net), m0))

    free, default = moved(alpha=0.0, beta=0.0), moved()
    assert default >= free / 4, (default, free)  # unscaled (scaling=False): 0.36 < 4.72 / 4
    net.load_state_dict(warm)
    o = parse_group(FedElmyOptions, "fedelmy", {"pool-size": 1, "select-best": False})
    res = FedElmyTrainer().train(TrainJob(net, x, y, ds.normalise, cfg, o, run_seed=0))
    assert res.metrics["grad-ratio"] < HELD_RATIO / 4, res.metrics  # not held: no warning


def test_a_pool_held_near_the_received_model_is_reported_and_warned(caplog):
    """On a small model and a few hundred images (a Flower user's template CNN), Eq. 9's
    pull (norm beta / s, s = 1 below the loss's decade) outweighs the loss's gradient: the
    default pool stays near ``m_0`` and learns little.  The reply's ``grad-ratio`` says so
    and one WARNING names ``fedelmy.beta``; at beta 0.1 the pool learns, with no warning.
    Measured (2026-11-29) on the template's own CNN and data: ratio 2.0, the 3 hops after
    its warm-up at 0.25 accuracy whatever the epochs (1, 3 or 6 per pool model); beta 0.1:
    ratio 0.07, 0.48 / 0.61 / 0.64."""
    import logging

    from fedsys.data import load_fashion_mnist
    from fedsys.models import build_model

    ds = load_fashion_mnist()
    idx = torch.randperm(len(ds.y_train), generator=torch.Generator().manual_seed(0))[:240]
    x, y = ds.x_train[idx], ds.y_train[idx]
    cfg = LocalConfig(epochs=1, batch_size=32, lr=1e-3, seed=1, optimizer="adam",
                      warmup_epochs=1)

    def pool(**opts: object) -> tuple[dict[str, float], float, list[str]]:
        net = build_model("blitz-cnn", ds.input_shape, ds.num_classes, 0)
        caplog.clear()
        o = parse_group(FedElmyOptions, "fedelmy", {"pool-size": 2, **opts})
        with caplog.at_level(logging.WARNING, logger="flwr"):
            res = FedElmyTrainer().train(TrainJob(net, x, y, ds.normalise, cfg, o, run_seed=0))
        return res.metrics, res.train_loss, [r.getMessage() for r in caplog.records
                                             if r.levelno == logging.WARNING]

    held, held_loss, warned = pool()
    assert held["grad-ratio"] > HELD_RATIO and held[POOL_HELD] == 1.0, held
    assert len(warned) == 1 and "fedelmy.beta" in warned[0] and "learn little" in warned[0]
    free, free_loss, quiet = pool(beta=0.1)
    assert free["grad-ratio"] < HELD_RATIO and free[POOL_HELD] == 0.0 and not quiet, (free, quiet)
    assert free["last-d2"] > 3 * held["last-d2"] and free_loss < held_loss, (free, held)
    # the unscaled ablation, held too: its warning names the switch, not App. A's decade
    off, _, said = pool(scaling=False)
    assert off[POOL_HELD] == 1.0 and len(said) == 1, (off, said)
    assert "fedelmy.scaling is false" in said[0] and "d2 =" not in said[0], said
