"""Local trainers: plain PyTorch, deterministic, FedProx's proximal term (Li et al. 2020, Eq. 2)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clients import TRAINERS, LocalConfig, TrainJob
from clients.base import TrainResult, batches
from clients.fedprox import proximal_term
from fedsys.data import make_synthetic
from fedsys.models import build_model


def setup():
    ds = make_synthetic(n_train=300, n_test=10)
    net = build_model("mlp", ds.input_shape, ds.num_classes, seed=0)
    return ds, net


def fit(name: str, net: nn.Module, ds, cfg: LocalConfig, mu: float = 0.1) -> TrainResult:
    """One round of the registered trainer ``name`` (FedProx with ``fedprox.mu = mu``)."""
    trainer = TRAINERS[name]
    opts = trainer.Options(mu=mu) if name == "fedprox" else trainer.Options()
    return trainer().train(TrainJob(net, ds.x_train, ds.y_train, ds.normalise, cfg, opts))


def state(net: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in net.state_dict().items()}


def test_batches_cover_each_epoch_once_and_follow_the_seed():
    got = list(batches(10, 4, 2, seed=1))
    assert [e for e, _ in got] == [0, 0, 0, 1, 1, 1]
    for ep in (0, 1):
        idx = torch.cat([i for e, i in got if e == ep])
        assert sorted(idx.tolist()) == list(range(10))
    again = list(batches(10, 4, 2, seed=1))
    assert all(torch.equal(a[1], b[1]) for a, b in zip(got, again, strict=True))
    other = torch.cat([i for _, i in batches(10, 4, 1, seed=2)])
    assert not torch.equal(other, torch.cat([i for e, i in got if e == 0]))


@pytest.mark.parametrize("name", ["sgd", "fedprox"])
def test_training_is_deterministic_and_reduces_loss(name):
    ds, net = setup()
    cfg = LocalConfig(epochs=3, batch_size=32, lr=0.1, seed=5)
    w0 = state(net)
    r1 = fit(name, net, ds, cfg)
    w1 = state(net)
    net.load_state_dict(w0)
    r2 = fit(name, net, ds, cfg)
    assert r1 == r2
    assert all(torch.equal(w1[k], v) for k, v in state(net).items())
    one = LocalConfig(epochs=1, batch_size=32, lr=0.1, seed=5)
    net.load_state_dict(w0)
    first = fit(name, net, ds, one)
    assert r1.train_loss < first.train_loss  # last-epoch loss after 3 epochs is lower
    assert r1.num_examples == 300 and r1.steps == 3 * 10


@pytest.mark.parametrize(("epochs", "max_steps"), [(2, 0), (3, 25), (1, 4)])
def test_sgd_loop_reports_the_last_epochs_mean_batch_loss(epochs, max_steps):
    """The reported loss is the mean over the last epoch's samples of each batch's loss
    before its step (batches of 32 and a last one of 12; a ``max-steps`` cut inside an
    epoch: that epoch's batches so far), as a plain loop with torch's SGD computes it."""
    ds, net = setup()
    ref = build_model("mlp", ds.input_shape, ds.num_classes, seed=0)
    cfg = LocalConfig(epochs=epochs, batch_size=32, lr=0.1, seed=3, max_steps=max_steps)
    got = fit("sgd", net, ds, cfg)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    per_epoch: dict[int, list[tuple[float, int]]] = {}
    for step, (epoch, idx) in enumerate(batches(300, 32, epochs, seed=3)):
        if max_steps and step == max_steps:
            break
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(ds.normalise(ds.x_train[idx])), ds.y_train[idx])
        loss.backward()
        opt.step()
        per_epoch.setdefault(epoch, []).append((float(loss.detach()), len(idx)))
    last = per_epoch[max(per_epoch)]
    assert got.train_loss == pytest.approx(sum(v * n for v, n in last) / sum(n for _, n in last),
                                           rel=1e-6)
    assert got.steps == sum(len(b) for b in per_epoch.values())
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in
               zip(net.state_dict().values(), ref.state_dict().values(), strict=True))


def test_max_steps_caps_local_work():
    ds, net = setup()
    r = fit("sgd", net, ds, LocalConfig(epochs=5, batch_size=32, max_steps=7, seed=0))
    assert r.steps == 7


def test_proximal_term_golden():
    net = nn.Linear(2, 1)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 2.0]]))
        net.bias.copy_(torch.tensor([0.5]))
    anchor = [torch.tensor([[0.0, 0.0]]), torch.tensor([1.5])]
    # (mu / 2) * (1^2 + 2^2 + (0.5 - 1.5)^2) = 0.5 * 0.3 * 6 = 0.9
    assert proximal_term(net, anchor, 0.3).item() == pytest.approx(0.9)


def test_fedprox_with_mu_zero_equals_sgd_and_large_mu_stays_closer():
    ds, net = setup()
    w0 = state(net)
    cfg = LocalConfig(epochs=2, batch_size=32, lr=0.1, seed=3)
    fit("sgd", net, ds, cfg)
    sgd = state(net)
    net.load_state_dict(w0)
    fit("fedprox", net, ds, cfg, 0.0)
    for k, v in state(net).items():
        torch.testing.assert_close(v, sgd[k])

    def drift(mu: float) -> float:
        net.load_state_dict(w0)
        fit("fedprox", net, ds, LocalConfig(epochs=2, batch_size=32, lr=0.1, seed=3), mu)
        return sum(float(((v - w0[k]) ** 2).sum()) for k, v in state(net).items())

    assert drift(5.0) < drift(0.0)


def test_divergence_raises_a_clear_error():
    ds, net = setup()
    with pytest.raises(FloatingPointError, match="diverged"):
        fit("sgd", net, ds, LocalConfig(epochs=3, batch_size=32, lr=1e6, seed=0))


@pytest.mark.parametrize(("kind", "momentum", "weight_decay"), [
    ("sgd", 0.0, 0.0), ("sgd", 0.9, 0.0), ("sgd", 0.9, 1e-3), ("sgd", 1e-4, 5e-4),
    ("adam", 0.0, 0.0), ("adam", 0.0, 1e-3),
])
def test_the_optimiser_steps_exactly_as_torch_optim(kind, momentum, weight_decay):
    """clients.optim.Optimiser calls torch's functional SGD / Adam with the arguments
    torch.optim.SGD / Adam pass: seven steps give the same parameters to the last bit,
    also for a layer that gets no gradient in some steps (left out, as torch does)."""
    from clients.optim import Optimiser

    def nets() -> tuple[nn.Module, nn.Module]:
        torch.manual_seed(3)
        a = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3), nn.Linear(3, 3))
        b = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3), nn.Linear(3, 3))
        b.load_state_dict(a.state_dict())
        return a, b

    ours_net, ref_net = nets()
    ours = Optimiser(ours_net.parameters(), kind, 0.05, momentum=momentum,
                     weight_decay=weight_decay)
    ref: torch.optim.Optimizer = (
        torch.optim.SGD(ref_net.parameters(), lr=0.05, momentum=momentum,
                        weight_decay=weight_decay) if kind == "sgd" else
        torch.optim.Adam(ref_net.parameters(), lr=0.05, weight_decay=weight_decay))
    g = torch.Generator().manual_seed(5)
    for step in range(7):
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        for net, opt in ((ours_net, ours), (ref_net, ref)):
            opt.zero_grad(set_to_none=True)
            head = net if step % 3 else net[:3]  # the last layer sits some steps out
            nn.functional.cross_entropy(head(x), y).backward()
            opt.step()
        for p, q in zip(ours_net.parameters(), ref_net.parameters(), strict=True):
            assert torch.equal(p, q), (kind, step)
    assert ours_net[0].weight.grad is not None
    ours.zero_grad()
    assert all(p.grad is None for p in ours_net.parameters())


def test_the_optimiser_names_a_wrong_kind_and_does_not_import_dynamo():
    import subprocess
    import sys

    from clients.optim import Optimiser

    with pytest.raises(ValueError, match="optimizer 'rmsprop'; allowed: sgd, adam"):
        Optimiser([torch.zeros(1, requires_grad=True)], "rmsprop", 0.1)
    code = ("import sys, torch; from clients.optim import Optimiser\n"
            "w = torch.zeros(3, requires_grad=True)\n"
            "for kind in ('sgd', 'adam'):\n"
            "    o = Optimiser([w], kind, 0.1, momentum=0.9); (w * w).sum().backward(); o.step()\n"
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
