"""Clients trained together (clients/batched.py) against the one-client loop they replace.

The batched loop must be the same computation: each client's data order, batches, step
count, optimiser state, loss and ``trained-examples`` as :func:`clients.base.sgd_loop` gives
it alone.  In float64 the two agree to 1e-5 relative per weight after an epoch (a wrong
batch, step or masked update is off by far more); in float32 they differ by the rounding of
the vmapped kernels, which the last test bounds on real Fashion-MNIST.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch

from clients.base import BatchSpec, LocalConfig, TrainJob, run_trainer
from clients.batched import (
    devices_for,
    group_key,
    shares,
    slower_batched,
    steps_of,
    train_together,
    unbatchable,
)
from clients.fedprox import FedProxOptions, FedProxTrainer
from clients.optim import Optimiser
from clients.sgd import SGDTrainer
from fedsys.data import Dataset, load_dataset
from fedsys.models import build_model
from fedsys.protocol import TRAINED_EXAMPLES


@pytest.fixture
def float64() -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@pytest.fixture(scope="module")
def fmnist() -> Dataset:
    """Fashion-MNIST, as the clients read it."""
    return load_dataset("fashion-mnist")


def _normalise(t: torch.Tensor) -> torch.Tensor:
    return (t - 0.5) / 0.5


def _clients(model: str, shape: tuple[int, int, int], sizes: list[int], cfg: LocalConfig,
             norm: str = "gn", spread: float = 0.01
             ) -> tuple[torch.nn.Module, list[dict[str, torch.Tensor]], list[TrainJob]]:
    """A model and, per size, a client: random data, its own seed and received weights
    (the model's, moved by ``spread``: FedCross sends each client its own)."""
    net = build_model(model, shape, 10, 0, norm)
    base = {k: v.detach().clone() for k, v in net.state_dict().items()}
    starts, jobs = [], []
    for c, n in enumerate(sizes):
        gen = torch.Generator().manual_seed(c)
        x = torch.rand((n, *shape), generator=gen)
        y = torch.randint(0, 10, (n,), generator=gen)
        starts.append({k: v + spread * torch.randn(v.shape, generator=gen) for k, v in base.items()})
        jobs.append(TrainJob(net, x, y, _normalise, LocalConfig(**{**vars(cfg), "seed": 100 + c})))
    return net, starts, jobs


def _alone(net: torch.nn.Module, start: dict[str, torch.Tensor], job: TrainJob, mu: float
           ) -> tuple[object, dict[str, torch.Tensor]]:
    """The job trained by its trainer, alone, as the ClientApp does (run_trainer)."""
    mine = copy.deepcopy(net)
    mine.load_state_dict(start)
    alone = TrainJob(mine, job.x, job.y, job.normalise, job.config, FedProxOptions(mu))
    res = run_trainer(FedProxTrainer() if mu else SGDTrainer(), alone)
    return res, {k: v.detach() for k, v in mine.state_dict().items()}


def _worst_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float(((a[k] - b[k]).abs() / b[k].abs().clamp_min(1e-12)).max()) for k in b)


CASES = [
    # model, input, client sizes (unequal: masked steps, short last batches), settings, mu
    ("mlp", (1, 28, 28), [60, 10, 75, 33, 64, 0],
     {"momentum": 0.9, "weight_decay": 1e-4}, 0.0),
    ("mlp", (1, 28, 28), [10, 70, 33, 64, 5], {"optimizer": "adam", "lr": 1e-3}, 0.0),
    ("mlp", (1, 28, 28), [10, 70, 33], {"trainable": "head", "epochs": 2, "momentum": 0.5}, 0.1),
    ("mlp", (1, 28, 28), [40, 90, 33], {"max_steps": 2}, 0.0),
    ("fmnist-cnn", (1, 28, 28), [40, 70, 33], {"momentum": 0.9}, 0.01),
    ("cifar-cnn", (3, 32, 32), [40, 70, 33], {"momentum": 0.9, "weight_decay": 5e-4}, 0.0),
    ("resnet18", (3, 16, 16), [20, 35], {"batch_size": 16, "momentum": 0.9}, 0.0),
]


@pytest.mark.parametrize(("model", "shape", "sizes", "settings", "mu"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_batched_client_is_the_client_trained_alone(float64, model, shape, sizes, settings, mu):
    cfg = LocalConfig(**{"epochs": 1, "batch_size": 32, "lr": 0.05, **settings})
    net, starts, jobs = _clients(model, shape, sizes, cfg)
    together = train_together(net, starts, jobs, [BatchSpec(mu)] * len(jobs))
    for start, job, (res, trained) in zip(starts, jobs, together, strict=True):
        expected, weights = _alone(net, start, job, mu)
        assert not isinstance(res, Exception)
        assert (res.steps, res.num_examples, res.metrics) == (
            expected.steps, expected.num_examples, expected.metrics)  # type: ignore[attr-defined]
        assert res.steps == steps_of(len(job.y), job.config)
        assert res.train_loss == pytest.approx(expected.train_loss, rel=1e-9)  # type: ignore[attr-defined]
        assert _worst_relative(trained, weights) < 1e-5
        if len(job.y) == 0:  # no step: what it received, untouched
            assert all(torch.equal(trained[k], start[k]) for k in start)
        if settings.get("trainable") == "head":  # frozen: exactly as received
            assert all(torch.equal(trained[k], start[k]) for k in start if not k.startswith("3."))


def test_clients_with_their_own_normalisation_are_each_trained_as_alone(float64):
    """Clients whose normalisations differ (no shared pool: each batch normalised by its
    client's own function, then padded) end as each trained alone: unequal sizes, momentum,
    the proximal term."""
    cfg = LocalConfig(epochs=1, batch_size=32, lr=0.05, momentum=0.9)
    net, starts, jobs = _clients("mlp", (1, 28, 28), [60, 10, 75, 33], cfg)
    for c, job in enumerate(jobs):
        job.normalise = lambda t, c=c: (t - 0.1 * c) / (0.5 + 0.1 * c)
    together = train_together(net, starts, jobs, [BatchSpec(0.01)] * len(jobs))
    for start, job, (res, trained) in zip(starts, jobs, together, strict=True):
        expected, weights = _alone(net, start, job, 0.01)
        assert not isinstance(res, Exception)
        assert res.steps == expected.steps  # type: ignore[attr-defined]
        assert res.train_loss == pytest.approx(expected.train_loss, rel=1e-9)  # type: ignore[attr-defined]
        assert _worst_relative(trained, weights) < 1e-5


def test_a_finished_client_is_left_exactly_as_it_was(float64):
    """A client of 10 samples takes one step, one of 70 three: the first's weights after
    the batched loop are, to the bit, what they were after the step both took (the same
    loop stopped there by max-steps), although the other went on stepping (with momentum
    and weight decay: state that could leak)."""
    for kind in ("sgd", "adam"):
        cfg = LocalConfig(epochs=1, batch_size=32, lr=0.05, momentum=0.9, weight_decay=1e-3,
                          optimizer=kind)
        net, starts, jobs = _clients("mlp", (1, 28, 28), [70, 10], cfg)
        both = train_together(net, starts, jobs, [BatchSpec()] * 2)
        assert both[1][0].steps == 1 and both[0][0].steps == 3
        for job in jobs:
            job.config = LocalConfig(**{**vars(job.config), "max_steps": 1})
        first = train_together(net, starts, jobs, [BatchSpec()] * 2)
        assert all(torch.equal(both[1][1][k], first[1][1][k]) for k in starts[1])
        assert not all(torch.equal(both[0][1][k], first[0][1][k]) for k in starts[0])


@pytest.mark.parametrize("ahead", [1, 2, 5])
def test_reading_batches_ahead_changes_nothing(monkeypatch, ahead):
    """The steps whose batches are read ahead at once (``PLANNED_STEPS``: their indices one
    copy to the device) leave every number as reading them step by step would: clients of
    unequal sizes over 2 epochs (rows finishing, epochs starting inside a read-ahead), with
    momentum and the proximal term, compared to the bit with the default read-ahead (all of
    this run's 10 steps at once)."""
    import clients.batched as batched

    cfg = LocalConfig(epochs=2, batch_size=16, lr=0.05, momentum=0.9)
    net, starts, jobs = _clients("mlp", (1, 28, 28), [70, 10, 45, 33], cfg)
    specs = [BatchSpec(0.01)] * len(jobs)
    whole = train_together(net, starts, jobs, specs)
    assert max(r.steps for r, _ in whole) == 10 <= batched.PLANNED_STEPS  # type: ignore[union-attr]
    monkeypatch.setattr(batched, "PLANNED_STEPS", ahead)
    parts = train_together(net, starts, jobs, specs)
    for (r1, w1), (r2, w2) in zip(whole, parts, strict=True):
        assert r1 == r2
        assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_step_rows_is_step_on_each_row():
    """The optimiser's update of stacked rows is its update of each row alone, to the bit
    (SGD with momentum and Adam; the last row finished after the first step)."""
    for kind in ("sgd", "adam"):
        gen = torch.Generator().manual_seed(1)
        rows = torch.randn(3, 4, generator=gen)
        grads = [torch.randn(3, 4, generator=gen) for _ in range(3)]
        stacked = Optimiser([rows], kind, 0.1, momentum=0.9, weight_decay=0.01)
        alone = [Optimiser([rows[r].clone()], kind, 0.1, momentum=0.9, weight_decay=0.01)
                 for r in range(3)]
        for t, g in enumerate(grads):
            live = 3 if t == 0 else 2
            stacked.step_rows(live, [g[:live]])
            for r in range(live):
                alone[r].params[0].grad = g[r].clone()
                alone[r].step()
        for r in range(3):
            assert torch.equal(rows[r], alone[r].params[0]), (kind, r)


def test_diverging_client_fails_alone(float64):
    """A client whose loss is NaN gets sgd_loop's error; the others train as without it."""
    cfg = LocalConfig(epochs=1, batch_size=16, lr=0.05)
    net, starts, jobs = _clients("mlp", (1, 28, 28), [20, 20], cfg)
    jobs[1].x[0, 0, 0, 0] = float("nan")
    out = train_together(net, starts, jobs, [BatchSpec()] * 2)
    assert isinstance(out[1][0], FloatingPointError)
    alone = train_together(net, starts[:1], jobs[:1], [BatchSpec()])
    assert all(torch.equal(out[0][1][k], alone[0][1][k]) for k in alone[0][1])


def test_refusals():
    cfg = LocalConfig(seed=1)
    net, starts, jobs = _clients("mlp", (1, 28, 28), [10, 10], cfg)
    other = TrainJob(net, jobs[1].x, jobs[1].y, _normalise, LocalConfig(seed=2, lr=0.5))
    with pytest.raises(ValueError, match="share their local configuration"):
        train_together(net, starts, [jobs[0], other], [BatchSpec()] * 2)
    assert group_key(LocalConfig(seed=1)) == group_key(LocalConfig(seed=2))
    bn = build_model("resnet18", (3, 32, 32), 10, 0, "bn")
    assert "BatchNorm2d" in str(unbatchable(bn))
    assert unbatchable(build_model("resnet18", (3, 32, 32), 10, 0, "gn")) is None
    # batch-clients: auto leaves convolutions on the CPU to one client at a time (measured
    # slower batched there), nothing on a GPU
    assert slower_batched(build_model("mlp", (1, 28, 28), 10, 0), "cpu") is None
    assert "'0' is a convolution" in str(slower_batched(build_model("fmnist-cnn", (1, 28, 28), 10, 0), "cpu"))
    assert slower_batched(build_model("fmnist-cnn", (1, 28, 28), 10, 0), "cuda") is None
    with pytest.raises(ValueError, match="cannot be trained batched"):
        train_together(bn, [bn.state_dict()], [TrainJob(bn, jobs[0].x, jobs[0].y, _normalise, cfg)],
                       [BatchSpec()])


def test_float32_rounding_on_fashion_mnist(fmnist):
    """In float32 (what runs), on real data at the default config's settings, batched and
    alone differ by kernel rounding: at most 1e-5 of each tensor's largest weight after an
    epoch of the MLP and the FMNIST CNN (measured: about 1e-7)."""
    x, y = fmnist.x_train[:240], fmnist.y_train[:240]
    for model in ("mlp", "fmnist-cnn"):
        net = build_model(model, (1, 28, 28), 10, 0)
        start = {k: v.detach().clone() for k, v in net.state_dict().items()}
        jobs = [TrainJob(net, x[i * 60:(i + 1) * 60 - 7 * i], y[i * 60:(i + 1) * 60 - 7 * i],
                         fmnist.normalise, LocalConfig(lr=0.01, momentum=0.9, seed=i)) for i in range(4)]
        out = train_together(net, [start] * 4, jobs, [BatchSpec()] * 4)
        for job, (res, trained) in zip(jobs, out, strict=True):
            _, weights = _alone(net, start, job, 0.0)
            for k, w in weights.items():
                assert float((trained[k] - w).abs().max()) <= 1e-5 * float(w.abs().max()), (model, k)
            assert res.metrics[TRAINED_EXAMPLES] == len(job.y)  # type: ignore[union-attr]


def test_a_round_is_spread_over_the_devices_a_quarter_each(float64, monkeypatch):
    """Four declared GPUs (mocked: each share trains on the CPU under its device's name):
    100 clients give each device 25, in the clients' order, all at once; the results are
    the one-device batch's, to float64 rounding, in the jobs' order."""
    import threading

    import clients.batched as batched

    assert [len(r) for r in shares(100, 4)] == [25] * 4
    assert [list(r) for r in shares(10, 4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert [len(r) for r in shares(3, 4)] == [1, 1, 1]
    assert devices_for("cpu") == ["cpu"]
    cfg = LocalConfig(epochs=1, batch_size=16, lr=0.05, momentum=0.9)
    net, starts, jobs = _clients("mlp", (1, 28, 28), [20 + 3 * i for i in range(100)], cfg)
    real, seen, lock = batched.train_together, [], threading.Lock()

    def on_device(net, starts, jobs, specs):
        with lock:
            seen.append((jobs[0].config.device, len(jobs), jobs[0].config.seed,
                         threading.current_thread().name))
        for job in jobs:  # the "GPU" is the CPU here
            job.config = LocalConfig(**{**vars(job.config), "device": "cpu"})
        return real(net, starts, jobs, specs)

    monkeypatch.setattr(batched, "train_together", on_device)
    spread = batched.train_on_devices(net, starts, jobs, [BatchSpec()] * 100,
                                      [f"cuda:{g}" for g in range(4)])
    assert sorted((d, n, s) for d, n, s, _ in seen) == [
        (f"cuda:{g}", 25, 100 + 25 * g) for g in range(4)]
    assert len({t for *_, t in seen}) == 4 and all(t.startswith("fedsys-device") for *_, t in seen)
    monkeypatch.setattr(batched, "train_together", real)
    whole = train_together(net, starts, jobs, [BatchSpec()] * 100)
    for (res, w), (ref, v) in zip(spread, whole, strict=True):
        assert (res.steps, res.metrics) == (ref.steps, ref.metrics)  # type: ignore[union-attr]
        assert _worst_relative(w, v) < 1e-9
    assert all(j.config.device == "cpu" for j in jobs)  # the caller's jobs untouched
