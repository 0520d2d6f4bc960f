"""Run the fedsys ServerApp and ClientApp in Flower's simulation engine, in process.

This is what ``fedsys run`` does.  It uses the same ``ServerApp`` and ``ClientApp``
objects as ``flwr run .``; the resolved config reaches both sides as
``context.run_config`` through a throw-away app directory whose
``pyproject.toml`` holds it.  Nothing keeps running afterwards.
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
import warnings
from collections.abc import Mapping
from logging import WARNING
from pathlib import Path
from typing import cast

from fedsys.config import RunConfig, toml_text
from fedsys_launch import flower_patches
from fedsys_launch.process.flower_env import FLWR_ENV


def write_app_dir(cfg: RunConfig, directory: Path) -> Path:
    """Write a minimal Flower app ``pyproject.toml`` whose run config is ``cfg``."""
    (directory / "pyproject.toml").write_text(toml_text({
        "project": {"name": "fedsys", "version": "0.1.0"},
        "tool": {"flwr": {"app": {
            "publisher": "fedsys",
            "components": {"serverapp": "fedsys_launch.apps.server_app:app",
                           "clientapp": "fedsys_launch.apps.client_app:app"},
            "config": cfg.to_dict()}}},
    }))
    return directory


def ray_address(environ: Mapping[str, str], configured: str = "") -> tuple[str, str]:
    """The Ray cluster a run joins and who said so, as ``NAME=address`` would read:
    config key ``ray-address`` (``configured``) wins over the environment variable
    ``RAY_ADDRESS``; ``("", "")`` for none."""
    if configured.strip():
        return configured.strip(), "ray-address"
    address = environ.get("RAY_ADDRESS", "").strip()
    return (address, "RAY_ADDRESS") if address else ("", "")


def ray_init_args(environ: Mapping[str, str], cpus_needed: float | None = None,
                  configured: str = "") -> dict[str, object]:
    """The ``ray.init`` arguments of a simulation: the cluster config key ``ray-address``
    (``configured``) or else ``RAY_ADDRESS`` names, or a cluster of its own.

    Given a cluster (``ray start --head`` on a multi-GPU box, or the test suite's one
    cluster per test process), the run joins it and leaves its size to it: Ray refuses
    ``num_cpus`` when joining.  Otherwise the run starts a private cluster with the
    cores of this machine, but no more than ``cpus_needed`` (rounded up): Flower starts one
    ClientApp actor per ``client-num-cpus`` of the cluster whatever the number of clients,
    and each actor imports torch (about 10 s of CPU and a few hundred MB), so a 3-client run
    on a 16-core box would start 16 of them.  ``address="local"`` keeps Ray from joining
    whatever cluster ``ray start`` last recorded under ``/tmp/ray`` instead.
    """
    address, _ = ray_address(environ, configured)
    if address and address != "local":
        return {"address": address, "include_dashboard": False}
    cpus = os.cpu_count() or 1
    if cpus_needed is not None and cpus_needed > 0:
        cpus = min(cpus, math.ceil(cpus_needed))
    return {"address": "local", "num_cpus": cpus, "include_dashboard": False}


def ray_address_problem(environ: Mapping[str, str], timeout: float = 5.0,
                        configured: str = "") -> str | None:
    """What is wrong with the Ray cluster's address (:func:`ray_address`), or None: unset,
    ``local``, ``auto`` (Ray looks for a cluster itself), or a ``host:port`` (``ray://``
    allowed) where something answers.

    Without this check a run given a dead address waits in ``ray.init`` without a word.
    """
    address, name = ray_address(environ, configured)
    if address in ("", "local", "auto"):
        return None
    source = f"config key {name}" if name == "ray-address" else f"environment variable {name}"
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return (f"{source}={address!r} is not host:port "
                "(e.g. 127.0.0.1:6379, as 'ray start --head' prints)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        return (f"{source}={address}: no Ray cluster answers there "
                f"({exc.strerror or exc}); start one ('ray start --head') or leave it unset "
                "to let the run start its own")
    return None


def simulate(cfg: RunConfig, verbose: bool = False, client_app: object | None = None) -> None:
    """Run ``cfg`` with ``num-clients`` simulated SuperNodes (Ray backend, ``engine: flower``).

    ``client_app`` replaces the fedsys ClientApp (tests use it to inject faults).  The
    ServerApp does not log the results table: the caller prints it, so a run shows one.

    The user is the operator here: both apps admit the run config under the policy of
    ``cfg`` itself (:func:`fedsys.confine.own_run_policy`), as objects built here, in this
    process (:func:`fedsys_launch.apps.server_app.make_app`,
    :func:`fedsys_launch.apps.client_app.make_app`, which reaches the Ray actors pickled); nothing
    a config or Flower loads by name can be one of them.

    With ``engine: inprocess`` the run goes to fedsys's own engine instead
    (:func:`fedsys_launch.engines.inprocess.simulate_inprocess`: every ClientApp called in this process).
    """
    if cfg.engine == "inprocess":
        if flower_patches.task_identity_usable():
            from fedsys_launch.engines.inprocess import simulate_inprocess

            simulate_inprocess(cfg, verbose=verbose, client_app=client_app)
            return
        from flwr.common.logger import log

        log(WARNING, "fedsys: engine 'inprocess' needs Flower's task identity as flwr "
            "1.41-1.42 have it (the WARNING above); this run uses engine 'flower'")
    os.environ.update({k: os.environ.get(k, v) for k, v in FLWR_ENV.items()})
    # Ray's notice that a later Ray will stop hiding GPUs from actors that asked for none:
    # fedsys relies on today's behaviour (client-num-gpus 0 means the clients see no GPU)
    warnings.filterwarnings("ignore", message="Tip: In future versions of Ray",
                            category=FutureWarning)
    from flwr.app import Context, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.telemetry import EventType

    from fedsys import confine
    from fedsys_launch.apps import client_app as client_module
    from fedsys_launch.apps import server_app as server_module

    # more actors than simulated nodes never train at once
    init_args = ray_init_args(os.environ, cfg.num_clients * cfg.client_num_cpus, cfg.ray_address)
    if "num_cpus" not in init_args:
        print(f"fedsys: joining the Ray cluster at "
              f"{ray_address(os.environ, cfg.ray_address)[1]}={init_args['address']}; "
              "its CPUs and GPUs decide how many clients train at once", flush=True)
    backend = {
        "client_resources": {"num_cpus": cfg.client_num_cpus, "num_gpus": cfg.client_num_gpus},
        "init_args": init_args,
    }
    policy = confine.own_run_policy(cfg)
    with tempfile.TemporaryDirectory(prefix="fedsys-app-") as tmp:
        app_dir = write_app_dir(cfg, Path(tmp))
        context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                          run_config=dict(cfg.to_dict()))
        with flower_patches.prompt_dispatch(), flower_patches.orderly_shutdown():
            _run_simulation(
                num_supernodes=cfg.num_clients,
                exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
                client_app=(client_module.make_app(policy) if client_app is None
                            else cast(ClientApp, client_app)),
                server_app=server_module.make_app(policy, log_table=False),
                backend_config=backend,  # type: ignore[arg-type]
                app_dir=str(app_dir),
                server_app_context=context,
                is_app=True,  # makes the engine read the run config from app_dir for clients
                verbose_logging=verbose,
            )
