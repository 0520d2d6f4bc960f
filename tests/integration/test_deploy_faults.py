"""Sites that die on a TLS deployment with node authentication (real processes on
127.0.0.1, its own deployment: :mod:`tests.integration.tls_deployment`): a SuperNode killed
while it trains, after which the round completes with the others and the strategy's rule
for missing clients holds (FedAvg aggregates the others, FedCross keeps that slot's model);
a one-shot FedELMY chain over the three nodes in the seeded order the server records, and
the same chain going on when a site dies in the middle of its hop.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedsys import checkpoint, metrics
from fedsys.chain import chain_order
from fedsys.params import from_torch
from fedsys.task import model
from launch.deploy import (
    LocalDeployment,
    _signal_all,
    descendants,
    node_exec_name,
    node_name,
)
from launch.registry import build
from tests.integration.tls_deployment import (  # noqa: F401  (tls_dep: the fixture dep)
    KILL_ROUND_TIMEOUT,
    NODES,
    ROOT,
    ROUND_TIMEOUT,
    _count,
    _wait_for,
    run_config,
    tls_dep,
)

pytestmark = [pytest.mark.slow, pytest.mark.deploy]


def _restart_site(dep: LocalDeployment, i: int, timeout: float = 180.0) -> None:
    """Restart SuperNode ``i`` and its SuperExec after a crash.

    The SuperLink refuses to activate a node id it still believes online (exit 305)
    until two missed heartbeats (60 s) have passed, so retry until it is let in.
    """
    log = dep.log_file(node_name(i))
    end = time.monotonic() + timeout
    while True:
        seen = _count(log, "SuperNode ID:")
        dep.start(node_name(i))
        while dep.is_running(node_name(i)) and _count(log, "SuperNode ID:") == seen:
            time.sleep(0.5)
        if _count(log, "SuperNode ID:") > seen:
            break
        assert time.monotonic() < end, f"{node_name(i)} not let back in:\n{log.read_text()[-2000:]}"
        time.sleep(5.0)
    dep.start(node_exec_name(i))


def _heal(dep: LocalDeployment) -> list[dict[str, Any]]:
    """Bring every crashed site back (same keys, hence same node ids); the nodes online."""
    for i in range(NODES):
        if not dep.is_running(node_name(i)):
            dep.kill(node_exec_name(i))
            _restart_site(dep, i)
        elif not dep.is_running(node_exec_name(i)):
            dep.start(node_exec_name(i))
    return dep.wait_online(NODES, 180)


KILLED = 1  # the SuperNode (and partition) killed in the middle of its training


def _chain_config(out: Path, name: str, **extra: object) -> dict[str, object]:
    return run_config(out, name, strategy="fedelmy", seed=7, lr=0.003, **{
        "fedelmy.pool-size": 2, "chain.warmup-epochs": 1, **extra})


def test_fedelmy_chain_runs_over_tls_in_the_recorded_order(dep: LocalDeployment,
                                                            tmp_path: Path) -> None:
    """A one-shot FedELMY chain over the three SuperNodes (TLS, node authentication):
    the server relays the model hop by hop in the seeded order and records it."""
    _heal(dep)
    log = dep.flwr_run(ROOT, _chain_config(tmp_path, "chain", **{"chain.order": "permutation"}),
                       timeout=900)
    recs = metrics.read_jsonl(tmp_path / "chain" / "fedelmy" / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2, 3], log[-3000:]
    hops = recs[1:]
    assert [r["client"] for r in hops] == chain_order(range(NODES), "permutation", 7)
    assert [r["hop"] for r in hops] == [1, 2, 3]
    assert all(r["clients-ok"] == 1 and r["hop-skipped"] == 0 for r in hops)
    assert hops[0]["trained-examples"] > hops[1]["trained-examples"]  # the warm-up
    assert recs[-1]["accuracy"] > recs[0]["accuracy"] + 0.2, recs
    assert "pass 1/1, hop 3/3" in log


def test_fedelmy_chain_goes_on_when_a_site_dies_mid_hop(dep: LocalDeployment,
                                                       tmp_path: Path) -> None:
    """SuperNode 1 is shut down while it trains its hop: the hop is tried again, then
    skipped, and the chain goes on to client 2 from client 0's model."""
    _heal(dep)
    proc = dep.submit(ROOT, _chain_config(tmp_path, "chain-kill"), tmp_path / "flwr.log")
    log = dep.log_file(node_name(KILLED))
    base = _count(log, "Receiving: train message")
    try:
        _wait_for(lambda: _count(log, "Receiving: train message") > base, 600,
                  f"a train message at {node_name(KILLED)}", proc)
        time.sleep(1.0)
        dep.kill(node_exec_name(KILLED))
        dep.kill(node_name(KILLED), signal.SIGTERM)
        assert proc.wait(timeout=600) == 0, (tmp_path / "flwr.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            _signal_all(descendants(proc.pid), signal.SIGKILL)
            proc.wait()
    out = (tmp_path / "flwr.log").read_text()
    recs = metrics.read_jsonl(tmp_path / "chain-kill" / "fedelmy" / "metrics.jsonl")[1:]
    assert [(r["client"], r["hop-skipped"]) for r in recs] == [(0, 0), (KILLED, 1), (2, 0)], out[-3000:]
    assert recs[2]["accuracy"] > recs[0]["accuracy"] - 0.05
    assert f"client {KILLED} skipped after 2 tries" in out, out[-3000:]
    _restart_site(dep, KILLED, timeout=60)

# How the site dies, per strategy: "shutdown" stops the SuperNode with SIGTERM (it
# tells the SuperLink, which answers NODE_UNAVAILABLE at once, and a restart is let in
# at once); "crash" SIGKILLs it (no reply ever comes: the round waits round-timeout or
# the SuperLink's heartbeat expiry, whichever is first, and the SuperLink refuses a
# restart until two heartbeats are missed, 60 s).  The
# crash case runs last, so nothing waits for the crashed site to come back.
KILL_CASES = [
    pytest.param("fedavg", "shutdown", id="fedavg-shutdown"),
    pytest.param("fedcross", "crash", id="fedcross-crash"),
]


@pytest.mark.parametrize(("strategy", "how"), KILL_CASES)
def test_killed_supernode_round_completes_with_the_others(
    dep: LocalDeployment, tmp_path: Path, strategy: str, how: str
) -> None:
    """One round; SuperNode 1 is killed while it trains, with its SuperExec and the
    ClientApp it runs (SIGKILL).  The round completes with the other two and the
    strategy's rule for a missing client holds.  After a shutdown the site restarts
    at once, with the same node id (registered key)."""
    ids = {n["node-id"] for n in _heal(dep)}
    assert len(ids) == NODES
    cfg = run_config(tmp_path, "killed", strategy=strategy, **{
        "num-server-rounds": 1,
        "round-timeout": KILL_ROUND_TIMEOUT if how == "crash" else ROUND_TIMEOUT})
    proc = dep.submit(ROOT, cfg, tmp_path / "flwr.log")
    log = dep.log_file(node_name(KILLED))
    base = _count(log, "Receiving: train message")
    try:
        _wait_for(lambda: _count(log, "Receiving: train message") > base, 600,
                  f"a train message at {node_name(KILLED)}", proc)
        time.sleep(1.0)  # its ClientApp is starting
        dep.kill(node_exec_name(KILLED))
        dep.kill(node_name(KILLED), signal.SIGKILL if how == "crash" else signal.SIGTERM)
        assert proc.wait(timeout=600) == 0, (tmp_path / "flwr.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            _signal_all(descendants(proc.pid), signal.SIGKILL)
            proc.wait()
    out = (tmp_path / "flwr.log").read_text()
    recs = metrics.read_jsonl(tmp_path / "killed" / strategy / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1], out[-3000:]
    assert recs[1]["clients-ok"] == NODES - 1 and recs[1]["clients-rejected"] == 1, recs
    # A shutdown tells the SuperLink at once.  A crash is seen either by the round's
    # timeout or, when the node's last heartbeat was early enough, by the SuperLink's
    # heartbeat expiry (2 x interval after that heartbeat), whichever comes first:
    # both are a refusal of the killed client by name, with its reason on that line.
    reasons = (("no reply before round-timeout", "Node Unavailable") if how == "crash"
               else ("Node Unavailable",))
    refused = [ln for ln in out.splitlines() if f"rejected reply of client {KILLED} " in ln]
    assert len(refused) == 1 and any(r in refused[0] for r in reasons), out[-3000:]
    assert recs[1]["accuracy"] > recs[0]["accuracy"]  # aggregated from the other two
    if strategy == "fedcross":
        _assert_failed_slot_kept(tmp_path / "killed" / strategy / "checkpoint.pt")
    if how == "shutdown":
        _restart_site(dep, KILLED, timeout=60)  # let in at once
        assert {n["node-id"] for n in dep.wait_online(NODES)} == ids
        started_as = re.findall(r"SuperNode ID: (\d+)", log.read_text())
        assert len(started_as) >= 2 and len(set(started_as)) == 1, started_as


def _slot_models(state: Any) -> list[dict[str, np.ndarray]]:
    """The K middleware models in a FedCross ``state_dict`` (a list of Params)."""
    if isinstance(state, list | tuple) and len(state) >= 2 and all(
            isinstance(m, dict) and m and all(isinstance(a, np.ndarray) for a in m.values())
            for m in state):
        return list(state)
    for v in state.values() if isinstance(state, dict) else []:
        if isinstance(v, dict | list | tuple):
            try:
                return _slot_models(v)
            except LookupError:
                continue
    raise LookupError("no list of slot models in the FedCross state")


def _assert_failed_slot_kept(ckpt_path: Path) -> None:
    ckpt = checkpoint.load(ckpt_path)
    cfg = build(ckpt["config"])
    init = from_torch(model(cfg).state_dict())
    slots = _slot_models(ckpt["strategy"])
    assert len(slots) == NODES
    unchanged = [all(np.array_equal(m[k], init[k]) for k in init) for m in slots]
    # all slots start as copies of the initial model; only the failed one is untouched
    assert sum(unchanged) == 1, unchanged
