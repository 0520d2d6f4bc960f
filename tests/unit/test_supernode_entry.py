"""fedsys_launch/deploy/supernode.py: Flower's SuperNode with a wider ClientApp start window."""

from __future__ import annotations

import subprocess
import sys

import pytest
from flwr.supercore.constant import TaskType
from flwr.supercore.corestate.in_memory_corestate import InMemoryCoreState
from flwr.supercore.date import now
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

from fedsys_launch import flower_patches
from fedsys_launch.deploy import supernode


def _claimed_window_s(state: InMemoryNodeState) -> float:
    """Seconds a freshly claimed task may wait for its ClientApp to check in."""
    task_id = state.create_task(task_type=TaskType.CLIENT_APP, run_id=1, fab_hash="f")
    assert task_id is not None
    token = state.claim_task(task_id)
    assert token is not None
    return (state.task_token_store[task_id].active_until - now()).total_seconds()


def test_a_claimed_task_waits_the_window_for_its_clientapp(monkeypatch):
    monkeypatch.setattr(InMemoryCoreState, "claim_task", InMemoryCoreState.claim_task)
    state = InMemoryNodeState(ObjectStoreFactory().store())
    assert 25 < _claimed_window_s(state) <= 30  # Flower 1.41's own: then a second ClientApp
    assert flower_patches.supernode_start_window(supernode.start_window_s({}), {})
    assert 295 < _claimed_window_s(InMemoryNodeState(ObjectStoreFactory().store())) <= 300


def test_a_shorter_window_keeps_flowers(monkeypatch):
    monkeypatch.setattr(InMemoryCoreState, "claim_task", InMemoryCoreState.claim_task)
    assert flower_patches.supernode_start_window(1.0, {})
    assert 25 < _claimed_window_s(InMemoryNodeState(ObjectStoreFactory().store())) <= 30


def test_window_from_the_environment_and_bad_values_refused():
    assert supernode.start_window_s({supernode.ENV: "120"}) == 120.0
    for bad in ("soon", "0", "-5", "nan", "inf"):
        with pytest.raises(SystemExit, match=supernode.ENV):
            supernode.start_window_s({supernode.ENV: bad})


def test_it_is_flowers_supernode_with_its_arguments():
    out = subprocess.run([sys.executable, "-m", "fedsys_launch.deploy.supernode", "--help"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith("usage: flower-supernode") and "--superlink" in out
