"""The in-process engine's workers on an existing Ray cluster (config key ``ray-address``,
fedsys_launch/engines/ray_training_workers.py), on a cluster of two nodes on 127.0.0.1: a head started with
``ray start --head`` and a second node with ``ray start --address=HEAD`` (as a second
machine would join; ``fedsys_launch.engines.shared_ray_cluster``), one CPU each.

A round's clients trained together go to one worker per node, half each, and come back
as :func:`clients.batched.train_on_devices` gives them with the same two shares on this
machine; ``fedsys run`` with the address in its config trains there and ends where the
same run ends without the cluster.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from clients.base import BatchSpec, LocalConfig, TrainJob
from clients.batched import train_on_devices
from fedsys import metrics
from fedsys.data import Normaliser
from fedsys.models import build_model
from fedsys_launch.commands.cli import main
from fedsys_launch.engines.shared_ray_cluster import ray_cluster, ray_node


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[str]:
    """A Ray cluster of two nodes on 127.0.0.1, one CPU each: its head's address."""
    root = Path(tempfile.mkdtemp(prefix="fedsys-rw-"))  # short: Ray's socket paths
    try:
        with ray_cluster(root / "head", num_cpus=1) as address, \
                ray_node(address, root / "node", num_cpus=1):
            yield address
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _jobs(n: int) -> tuple[torch.nn.Module, list[dict[str, torch.Tensor]], list[TrainJob],
                           Normaliser]:
    """An MLP and ``n`` clients of unequal sizes with uint8 images, each its own seed and
    received weights."""
    net = build_model("mlp", (1, 28, 28), 10, 0, "gn")
    base = {k: v.detach().clone() for k, v in net.state_dict().items()}
    norm = Normaliser((0.3,), (0.35,))
    cfg = LocalConfig(epochs=2, batch_size=16, lr=0.05, momentum=0.9)
    starts, jobs = [], []
    for c in range(n):
        gen = torch.Generator().manual_seed(c)
        size = 20 + 7 * c
        x = torch.randint(0, 256, (size, 1, 28, 28), generator=gen, dtype=torch.uint8)
        y = torch.randint(0, 10, (size,), generator=gen)
        starts.append({k: v + 0.01 * torch.randn(v.shape, generator=gen) for k, v in base.items()})
        jobs.append(TrainJob(net, x, y, norm, LocalConfig(**{**vars(cfg), "seed": 100 + c})))
    return net, starts, jobs, norm


def test_a_round_is_cut_between_the_nodes_and_comes_back_as_trained_here(two_nodes):
    from fedsys_launch.engines.ray_training_workers import RayWorkers

    net, starts, jobs, norm = _jobs(10)
    workers = RayWorkers(two_nodes, "cpu")
    try:
        assert len(workers.places) == 2
        assert len({node for node, _ in workers.places}) == 2  # one worker on each node
        assert {device for _, device in workers.places} == {"cpu"}
        there = workers.train(net, starts, jobs, [BatchSpec()] * 10, norm)
        # a worker that dies: its share fails naming its node, the other's trains; then
        # the one left trains every share
        import ray

        node = workers.places[1][0]
        ray.kill(workers.actors[1])
        after = workers.train(net, starts, jobs, [BatchSpec()] * 10, norm)
        assert len(workers.actors) == len(workers.places) == 1
        last = workers.train(net, starts, jobs, [BatchSpec()] * 10, norm)
    finally:
        workers.close()
    for res, weights in after[5:]:
        assert isinstance(res, RuntimeError) and not weights
        assert f"the Ray worker on node {node} (cpu) of the cluster at {two_nodes} died" in str(res)
    assert all(torch.equal(a[1][k], b[1][k]) for a, b in zip(after[:5], there, strict=False)
               for k in b[1])
    assert not any(isinstance(res, Exception) for res, _ in last)
    for (_, w), (_, v) in zip(last, there, strict=True):  # one batch of 10, not two of 5
        assert all(torch.allclose(w[k], v[k], rtol=1e-5, atol=1e-7) for k in v)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker (one CPU a node)
    try:
        here = train_on_devices(net, starts, jobs, [BatchSpec()] * 10, ["cpu", "cpu"])
    finally:
        torch.set_num_threads(before)
    assert len(there) == 10
    for (res, w), (ref, v) in zip(there, here, strict=True):
        assert (res.num_examples, res.steps, res.metrics) == (  # type: ignore[union-attr]
            ref.num_examples, ref.steps, ref.metrics)  # type: ignore[union-attr]
        assert res.train_loss == ref.train_loss  # type: ignore[union-attr]
        assert all(torch.equal(w[k], v[k]) for k in v)


def _final(run: Path, strategy: str) -> dict[str, float]:
    return metrics.read_jsonl(run / strategy / "metrics.jsonl")[-1]  # type: ignore[no-any-return]


def test_fedsys_run_trains_on_the_cluster_named_in_its_config(two_nodes, tmp_path, capsys, caplog):
    args = ["run", "--set", "dataset=synthetic", "--set", "model=mlp", "--set", "num-clients=8",
            "--set", "clients-per-round=6", "--set", "num-server-rounds=2",
            "--set", "engine=inprocess", "--set", f"output-dir={tmp_path}"]
    assert main([*args, "--set", "name=cluster", "--set", f"ray-address={two_nodes}"]) == 0
    assert "2 Ray workers (cpu) on 2 nodes of the cluster at " + two_nodes in caplog.text
    assert main([*args, "--set", "name=here"]) == 0
    for strategy in ("fedavg", "fedprox"):  # the default strategies
        there, here = (_final(tmp_path / r, strategy) for r in ("cluster", "here"))
        assert there["round"] == here["round"] == 2
        assert there["trained-examples"] == here["trained-examples"]
        for key in ("accuracy", "loss", "train-loss", "global-step"):
            assert there[key] == pytest.approx(here[key], rel=1e-4, abs=1e-6), (strategy, key)
