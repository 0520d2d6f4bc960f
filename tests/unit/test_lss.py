"""Local Superior Soups (spec ``lss.md``): the simplex draws, the interpolated loss's
gradient reaching only the ingredient, each regulariser's gradient against finite
differences, the Cayley-Menger volume, the soup with and without the anchor, and the
code form against the paper form."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from clients import TRAINERS, LocalConfig, TrainJob
from clients.lss import LssTrainer, Soup
from fedsys import lss
from fedsys import pool as pool_ops
from fedsys.options import parse_group


def test_simplex_weights_are_on_the_simplex_and_uniform():
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([lss.simplex_weights(4, g) for _ in range(4000)])
    assert (draws >= 0).all() and torch.allclose(draws.sum(1), torch.ones(4000, dtype=torch.float64))
    assert torch.allclose(draws.mean(0), torch.full((4,), 0.25, dtype=torch.float64), atol=0.01)
    # uniform on the simplex: each coordinate is Beta(1, K-1), variance (K-1)/(K^2 (K+1))
    assert abs(float(draws[:, 0].var()) - 3 / (16 * 5)) < 0.004
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(lss.simplex_weights(3, g1), lss.simplex_weights(3, g2))


def test_interpolation_gives_gradient_only_to_the_live_member_scaled_by_its_weight():
    g = torch.Generator().manual_seed(1)
    frozen = [torch.randn(6, generator=g) for _ in range(2)]
    live = torch.randn(6, generator=g, requires_grad=True)
    w = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    f_s = lss.interpolate(frozen, live, w)
    assert torch.allclose(f_s, 0.2 * frozen[0] + 0.3 * frozen[1] + 0.5 * live)
    f_s.pow(2).sum().backward()
    assert torch.allclose(live.grad, 0.5 * 2 * f_s.detach())
    assert all(not m.requires_grad for m in frozen)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_cayley_menger_volume_is_length_area_volume_squared(k):
    pts = torch.eye(3, dtype=torch.float64)[: k - 1] * 2.0
    pts = torch.cat([torch.zeros(1, 3, dtype=torch.float64), pts])  # right-angled simplex
    d = torch.cdist(pts, pts) ** 2
    want = {2: 4.0, 3: (0.5 * 2 * 2) ** 2, 4: (2 * 2 * 2 / 6) ** 2}[k]
    assert math.isclose(float(lss.cayley_menger_volume2(d)), want, rel_tol=1e-9)


def test_volume_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(2)
    others = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(3)]
    theta = torch.randn(5, generator=g, dtype=torch.float64)

    def vol2(t: torch.Tensor) -> float:
        pts = torch.stack([*others, t])
        return float(lss.cayley_menger_volume2(torch.cdist(pts, pts) ** 2))

    grad, v = lss.volume_gradient(theta, others)
    assert math.isclose(v, vol2(theta), rel_tol=1e-9)
    eps = 1e-6
    fd = torch.tensor([(vol2(theta + eps * e) - vol2(theta - eps * e)) / (2 * eps)
                       for e in torch.eye(5, dtype=torch.float64)], dtype=torch.float64)
    assert torch.allclose(grad, fd, atol=1e-6)
    # at the centroid of the others the simplex is flat: no volume and no push (spec §2.4)
    g0, v0 = lss.volume_gradient(torch.stack(others).mean(0) * 0 + others[0], others[:1])
    assert v0 == 0.0 and torch.count_nonzero(g0) == 0


def test_paper_regulariser_gradient_uses_the_literal_one_over_k():
    """Eq. 4 averages over the whole pool including f_i itself (a zero term): the trainer
    passes the i others with weight lambda_d * i / (i + 1)."""
    g = torch.Generator().manual_seed(3)
    members = [torch.randn(4, generator=g, dtype=torch.float64) for _ in range(3)]  # f_p, f_1, f_2
    theta0 = torch.randn(4, generator=g, dtype=torch.float64)
    la, ld, i = 0.7, 1.3, 3

    def reg(t: torch.Tensor) -> torch.Tensor:
        k = i + 1
        div = sum(torch.linalg.vector_norm(t - m) for m in [*members, t]) / k
        return la * torch.linalg.vector_norm(t - members[0]) - ld * div

    t = theta0.clone().requires_grad_(True)
    reg(t).backward()
    grad, _, _ = pool_ops.distance_gradient(theta0, members, members[0], ld * i / (i + 1), la)
    assert torch.allclose(grad, t.grad)
    eps = 1e-6
    fd = torch.tensor([float(reg(theta0 + eps * e) - reg(theta0 - eps * e)) / (2 * eps)
                       for e in torch.eye(4, dtype=torch.float64)], dtype=torch.float64)
    assert torch.allclose(grad, fd, atol=1e-7)


def _job(seed: int = 3, epochs: int = 1, **opts: Any) -> TrainJob:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 8), torch.nn.ReLU(),
                              torch.nn.Linear(8, 3))
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 255, (64, 1, 3, 4), generator=g, dtype=torch.uint8)
    y = (x.float().mean((1, 2, 3)) > 127).long() + (x[:, 0, 0, 0] > 200).long()
    options = parse_group(LssTrainer.Options, "lss", {f"lss.{k.replace('_', '-')}": v
                                                      for k, v in opts.items()})
    return TrainJob(net, x, y, lambda b: b.float() / 255,
                    LocalConfig(epochs=epochs, batch_size=16, lr=1e-2, seed=seed), options)


def _vec(net: torch.nn.Module) -> torch.Tensor:
    return pool_ops.trainable_vector(net)


def test_the_soup_with_and_without_the_anchor():
    """N = 1 without regularisers: f_1 starts at f_p and trains on its own loss (a pool of
    one frozen member plus itself); the soup is (f_p + f_1)/2 with the anchor, f_1 without."""
    with_a, without = _job(ingredients=1, affinity=0.0, diversity=0.0),\
        _job(ingredients=1, affinity=0.0, diversity=0.0, include_anchor="no")
    f_p = _vec(with_a.net)
    LssTrainer().train(with_a)
    LssTrainer().train(without)
    f_1 = _vec(without.net)
    assert not torch.allclose(f_1, f_p)
    assert torch.allclose(_vec(with_a.net), (f_p + f_1) / 2, atol=1e-6)


def test_lss_is_deterministic_reports_its_soup_and_trains_n_ingredients():
    a, b = _job(ingredients=3, affinity=0.1, diversity=0.1), _job(ingredients=3, affinity=0.1, diversity=0.1)
    ra, rb = LssTrainer().train(a), LssTrainer().train(b)
    assert torch.equal(_vec(a.net), _vec(b.net)) and ra.metrics == rb.metrics
    assert ra.metrics["soup-size"] == 4 and ra.steps == 3 * 4  # 3 ingredients x 4 batches
    assert ra.metrics["trained-examples"] == 3 * 64
    c = _job(seed=4, ingredients=3, affinity=0.1, diversity=0.1)
    LssTrainer().train(c)
    assert not torch.equal(_vec(a.net), _vec(c.net))  # the draws follow the round's seed


def test_code_form_differs_from_paper_form_and_leaves_the_anchor_out():
    paper, code = _job(ingredients=2, affinity=0.0, diversity=0.0), _job(
        ingredients=2, affinity=0.0, diversity=0.0, form="code", accumulation=2, epochs=8)
    f_p = _vec(code.net)
    rp, rc = LssTrainer().train(paper), LssTrainer().train(code)
    assert rc.metrics["soup-size"] == 2 and rp.metrics["soup-size"] == 3
    assert not torch.allclose(_vec(paper.net), _vec(code.net))
    # code form: v_0 fine-tuned 8 epochs (32 steps), v_1 max(1, 8 // 8) = 1 epoch of 4
    # batches stepping every 2 (2 Adam steps, every batch counted)
    assert rc.steps == 32 + 4
    assert not torch.allclose(_vec(code.net), f_p)


def test_the_live_model_alone_receives_the_task_gradient():
    job = _job(ingredients=2)
    soup = Soup(job)
    frozen = [soup.anchor.clone(), soup.anchor.clone() + 0.1]
    before = [m.clone() for m in frozen]
    x, y = job.normalise(job.x[:16]), job.y[:16]
    soup.task_loss(frozen, x, y, 2).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in soup.params)
    assert all(torch.equal(a, b) for a, b in zip(frozen, before, strict=True))


def test_lss_is_registered():
    assert TRAINERS["lss"] is LssTrainer
