"""fedsys_launch/flower_patches.py: every change fedsys makes to Flower's code, each checked
against its target when applied.  Here, for each patch, a Flower whose target does not
match (as a later release might change it): the patch is not applied, Flower's own
behaviour stays, and one WARNING per process says which patch and why; a security patch
that does not fit stops the component instead (each in test_security_patches.py).  That
each patch does what it says on this Flower is tested beside its user
(test_superlink_entry, test_supernode_entry, test_superexec_entry, test_dispatch,
test_inprocess, test_security_patches)."""


from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from flwr.supercore.corestate.in_memory_corestate import InMemoryCoreState
from flwr.supercore.corestate.sql_corestate import SqlCoreState

from fedsys_launch import flower_patches
from fedsys_launch.deploy import superexec


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flower_patches, "_warned", set())


def _warnings(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and f"patch '{name}'" in r.getMessage()]


def test_every_patch_fits_this_flower_and_is_described() -> None:
    """On the Flower releases fedsys supports (CI runs this on both ends), every target
    matches; each patch says what it changes and what it buys, and docs/performance.md
    has a row for it."""
    assert set(flower_patches.CHECKS) == set(flower_patches.PATCHES)
    page = (Path(__file__).resolve().parents[2] / "docs" / "performance.md").read_text()
    for name, check in flower_patches.CHECKS.items():
        assert check() is None, name
        p = flower_patches.PATCHES[name]
        assert p.versions and p.upstream and p.change and p.buys and p.target.startswith("flwr.")
        assert f"`{name}`" in page, name


def _other_claim(self: Any, task_id: int, extra: int = 0) -> str | None:  # a later Flower's, say
    return None


@pytest.mark.parametrize(("name", "cls", "apply"), [
    ("superlink-start-window", SqlCoreState, flower_patches.superlink_start_window),
    ("supernode-start-window", InMemoryCoreState, flower_patches.supernode_start_window),
])
def test_a_claim_task_of_another_shape_keeps_flowers_window(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str,
        cls: type, apply: Any) -> None:
    monkeypatch.setattr(cls, "claim_task", _other_claim)
    assert not apply(300.0, {}) and not apply(300.0, {})
    assert cls.claim_task is _other_claim  # type: ignore[attr-defined]
    said = _warnings(caplog, name)
    assert len(said) == 1 and "claim_task(self, task_id)" in said[0], said
    assert "Flower's own behaviour stays" in said[0] and "written for flwr 1.41, 1.42" in said[0]


def test_an_executor_of_another_shape_stops_the_superexec(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A security patch (``private-task-tokens``) that does not fit stops the SuperExec:
    Flower's own executor would put each task token on a command line.  Turned off by
    name, it WARNs and Flower's ``Popen`` stays."""
    import importlib

    from flwr.supercore.superexec.executor import subprocess_executor

    flower_superexec = importlib.import_module("flwr.supercore.cli.flower_superexec")
    monkeypatch.setattr(flower_superexec, "run_superexec", flower_superexec.run_superexec)
    started: list[object] = []
    monkeypatch.setattr(superexec, "AppStarter", lambda preload: started.append(preload))
    other = object()  # not the subprocess module: its launch starts processes otherwise
    monkeypatch.setattr(subprocess_executor, "subprocess", other)
    with pytest.raises(SystemExit, match="Flower patch 'private-task-tokens' does not fit"):
        superexec.apply({superexec.ENV: "numpy"})
    assert subprocess_executor.subprocess is other and started == []  # no fork server
    said = _warnings(caplog, "warm-app-processes")  # the fork server's own patch: skipped
    assert len(said) == 1 and "subprocess.Popen" in said[0]
    # turned off by name: a WARNING, and Flower's Popen stays
    monkeypatch.setattr(subprocess_executor, "subprocess", subprocess)
    caplog.clear()
    superexec.apply({superexec.ENV: "", flower_patches.ENV: "private-task-tokens"})
    assert subprocess_executor.subprocess is subprocess
    said = _warnings(caplog, "private-task-tokens")
    assert len(said) == 1 and "turned off (FEDSYS_FLOWER_PATCHES)" in said[0], said
    assert "/proc/PID/cmdline" in said[0]


def test_a_dispatch_loop_of_another_shape_stays_flowers(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from flwr.server.superlink.fleet.vce import vce_api

    def other(state: Any, queue: Any, nodes_mapping: Any, f_stop: Any, extra: Any) -> None:
        return None

    monkeypatch.setattr(vce_api, "add_messages_to_queue", other)
    for _ in range(2):
        with flower_patches.prompt_dispatch({}) as replaced:
            assert not replaced and vce_api.add_messages_to_queue is other
    said = _warnings(caplog, "prompt-dispatch")
    assert len(said) == 1 and "add_messages_to_queue takes" in said[0]


def test_a_task_identity_of_another_shape_leaves_the_inprocess_engine_out(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import flwr.supercore.task_identity as module

    class Other:  # a later Flower's, say: no settable run_id
        _task_id = None

    monkeypatch.setattr(module, "TaskIdentity", Other)
    assert not flower_patches.task_identity_usable({})
    said = _warnings(caplog, "task-identity")
    assert len(said) == 1 and "no settable task_id, run_id, node_id" in said[0], said


def test_a_patch_turned_off_by_name_stays_out_and_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from flwr.server.superlink.fleet.vce import vce_api

    flowers = vce_api.add_messages_to_queue
    with caplog.at_level(logging.INFO):
        with flower_patches.prompt_dispatch({flower_patches.ENV: "prompt-dispatch"}) as on:
            assert not on and vce_api.add_messages_to_queue is flowers
    assert "patch 'prompt-dispatch' turned off (FEDSYS_FLOWER_PATCHES)" in caplog.text
    assert not _warnings(caplog, "prompt-dispatch")
    assert flower_patches.turned_off("task-identity", {flower_patches.ENV: "none"})
    assert not flower_patches.turned_off("task-identity", {flower_patches.ENV: "prompt-dispatch"})
