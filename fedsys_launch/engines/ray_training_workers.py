"""The in-process engine's workers on an existing Ray cluster (config key ``ray-address``).

``fedsys run --set engine=inprocess --set ray-address=HEAD:PORT`` keeps the ServerApp, the
strategies and every ClientApp call in the run's process, as without a cluster, and sends
the one costly part, each group of clients trained together
(:func:`clients.batched.train_together`), to Ray workers on the cluster: one per GPU of the
cluster where the run's device allows a GPU, else one per node using the node's CPUs.  A
round's group is cut into contiguous shares, a worker each (:func:`clients.batched.shares`),
trained at once; the results come back in the clients' order.  What a worker gets is
what training needs (the model, each client's samples, labels and local configuration,
the received weights, the normalisation) and it sends back the trained weights and what
the trainer reports; nothing of the run's state lives on a worker, so a round is the same
whichever workers train it (to float rounding: another cut of the group into batches).

Every node runs the fedsys and torch of its own Python (install them on each machine, as
for ``ray start``).  A worker that dies fails the clients of its share in that round (their
nodes reply with an error naming its node, as a ClientApp that raises) and is dropped;
with none left the clients train in this process.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

from flwr.common.logger import log

from clients.base import BatchSpec, LocalConfig, TrainJob, TrainResult
from clients.batched import shares
from fedsys.config import ConfigError
from fedsys.data import Normaliser

if TYPE_CHECKING:
    import torch
    from torch import nn

State = dict[str, "torch.Tensor"]
Trained = tuple["TrainResult | Exception", State]
#: One client of a share: its samples, labels and local configuration.
Client = tuple["torch.Tensor", "torch.Tensor", LocalConfig]


class ShareWorker:
    """One Ray actor: trains the shares of a round's batched clients sent to it, on its
    own device (``cuda`` in an actor given a GPU: Ray shows it that one), with ``threads``
    torch threads (0: torch's default)."""

    def __init__(self, device: str, threads: int) -> None:
        import torch

        self.device = device
        if threads:
            torch.set_num_threads(threads)

    def where(self) -> tuple[str, str]:
        """The Ray node this worker runs on, and its device."""
        import ray

        return ray.get_runtime_context().get_node_id(), self.device

    def train(self, net: nn.Module, starts: Sequence[State], clients: Sequence[Client],
              specs: Sequence[BatchSpec], normalise: Normaliser) -> list[Trained]:
        """:func:`clients.batched.train_together` of ``clients`` from ``starts`` on this
        worker's device; the weights come back on the CPU, each in a tensor of its own."""
        from clients.batched import train_together

        jobs = [TrainJob(net, x, y, normalise, dataclasses.replace(cfg, device=self.device))
                for x, y, cfg in clients]
        out = train_together(net, starts, jobs, specs)
        # a row of the stacked weights would carry the whole stack with it
        return [(res, {k: v.detach().cpu().clone() for k, v in state.items()})
                for res, state in out]


class RayWorkers:
    """The workers of one run on the Ray cluster at ``address``.

    Parameters
    ----------
    address : str
        ``host:port`` of the cluster's head (``ray start --head`` prints it), or ``auto``.
    device : str
        The run's device: ``cuda`` asks for a worker on each GPU of the cluster (refused
        where it has none), ``auto`` takes the GPUs where there are any, ``cpu`` a worker
        on each node with the node's CPUs.

    Raises
    ------
    ConfigError
        No cluster answers, or it has none of what ``device`` asks for.
    """

    def __init__(self, address: str, device: str) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.address = address
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False,
                     configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"config key ray-address={address}: no Ray cluster could be "
                              f"joined there ({exc})") from None
        try:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            gpus = int(sum(n["Resources"].get("GPU", 0) for n in nodes))
            remote: Any = ray.remote(ShareWorker)
            #: the workers (Ray actor handles)
            self.actors: list[Any] = []
            if device in ("cuda", "auto") and gpus:
                self.actors = [remote.options(num_gpus=1, num_cpus=0).remote("cuda", 0)
                               for _ in range(gpus)]
            elif device == "cuda":
                raise ConfigError(f"config key 'device' is cuda but the Ray cluster at "
                                  f"ray-address={address} has no GPU")
            else:
                for n in nodes:
                    cpus = int(n["Resources"].get("CPU", 0))
                    if cpus:
                        self.actors.append(remote.options(
                            num_cpus=cpus, scheduling_strategy=NodeAffinitySchedulingStrategy(
                                n["NodeID"], soft=False)).remote("cpu", cpus))
            if not self.actors:
                raise ConfigError(f"config key ray-address={address}: the cluster has no CPU "
                                  "or GPU a worker could use")
            #: (node id, device) of each worker, asked once: each has started
            try:
                self.places: list[tuple[str, str]] = ray.get(
                    [a.where.remote() for a in self.actors], timeout=300)
            except ray.exceptions.GetTimeoutError:
                raise ConfigError(f"config key ray-address={address}: {len(self.actors)} Ray "
                                  "workers did not start within 300 s (are the cluster's CPUs "
                                  "or GPUs held by other jobs? 'ray status' says)") from None
        except BaseException:
            ray.shutdown()
            raise
        log(INFO, "fedsys: %d Ray workers (%s) on %d nodes of the cluster at %s train the "
            "clients trained together", len(self.actors), self.places[0][1],
            len({p[0] for p in self.places}), address)

    @property
    def device(self) -> str:
        """Where the workers train (``cuda`` or ``cpu``): what decides, under
        ``batch-clients: auto``, whether a model is faster batched."""
        return self.places[0][1] if self.places else "cpu"

    def train(self, net: nn.Module, starts: Sequence[State], jobs: Sequence[TrainJob],
              specs: Sequence[BatchSpec], normalise: Normaliser) -> Sequence[Trained]:
        """:func:`clients.batched.train_together` of the jobs, a contiguous share on each
        worker at once; the results in the jobs' order.

        A worker that died or failed fails its share's clients (a ``RuntimeError`` naming
        its node in place of each one's result: their nodes reply with it, and the
        strategy counts them failed), and a dead one is dropped, said in a WARNING; with no
        worker left the jobs train in this process (:func:`clients.batched.train_together`).
        """
        import ray

        if not self.actors:
            from clients.batched import train_together

            return train_together(net, starts, jobs, specs)
        cuts = shares(len(jobs), len(self.actors))
        model = ray.put(net)
        refs = [actor.train.remote(model, [starts[i] for i in rows],
                                   [(jobs[i].x.clone(), jobs[i].y.clone(), jobs[i].config)
                                    for i in rows],
                                   [specs[i] for i in rows], normalise)
                for actor, rows in zip(self.actors, cuts, strict=False)]
        out: list[Trained] = []
        dead = []
        for w, (ref, rows) in enumerate(zip(refs, cuts, strict=False)):
            node, device = self.places[w]
            try:
                out.extend(ray.get(ref))
            except ray.exceptions.RayError as exc:
                died = isinstance(exc, ray.exceptions.RayActorError)
                why = (f"the Ray worker on node {node} ({device}) of the cluster at "
                       f"{self.address} {'died' if died else 'failed'}: "
                       f"{str(exc).strip().splitlines()[0]}")
                out.extend((RuntimeError(why), {}) for _ in rows)
                if died:
                    dead.append(w)
                    log(WARNING, "fedsys: %s; its %d clients fail this round, %d workers are "
                        "left%s", why, len(rows), len(self.actors) - len(dead),
                        "" if len(dead) < len(self.actors) else
                        " (the next rounds train in this process)")
        self.actors = [a for w, a in enumerate(self.actors) if w not in dead]
        self.places = [p for w, p in enumerate(self.places) if w not in dead]
        return out

    def close(self) -> None:
        """Stop the workers and leave the cluster (which goes on running)."""
        import ray

        for actor in self.actors:
            ray.kill(actor)
        ray.shutdown()


__all__ = ["RayWorkers", "ShareWorker"]
