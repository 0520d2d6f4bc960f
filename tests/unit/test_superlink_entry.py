"""fedsys_launch/deploy/superlink.py: Flower's SuperLink with a longer SQLite busy timeout and a wider
ServerApp start window."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from datetime import UTC

import pytest
from flwr.supercore import sql_mixin
from flwr.supercore.constant import TaskType
from flwr.supercore.corestate.sql_corestate import SqlCoreState
from flwr.supercore.date import now
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.state.schema.corestate_models import Task as TaskModel
from flwr.supercore.utils import uint64_to_int64
from sqlalchemy import select

from fedsys_launch import flower_patches
from fedsys_launch.deploy import superlink


def test_every_new_connection_waits_the_longer_timeout(monkeypatch, tmp_path):
    monkeypatch.setattr(sql_mixin, flower_patches.PRAGMAS, getattr(sql_mixin, flower_patches.PRAGMAS))
    conn = sqlite3.connect(tmp_path / "a.db")
    sql_mixin._set_sqlite_pragmas(conn, None)
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000  # Flower 1.41's own
    assert flower_patches.sqlite_busy_timeout(superlink.busy_timeout_ms({}), {})
    conn = sqlite3.connect(tmp_path / "b.db")
    sql_mixin._set_sqlite_pragmas(conn, None)
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 120_000
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # the rest kept


def test_timeout_from_the_environment_and_bad_values_refused():
    assert superlink.busy_timeout_ms({superlink.ENV: "30000"}) == 30_000
    for bad in ("soon", "0", "-5"):
        with pytest.raises(SystemExit, match=superlink.ENV):
            superlink.busy_timeout_ms({superlink.ENV: bad})


def test_a_flower_without_the_pragma_keeps_its_own_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(sql_mixin, flower_patches.PRAGMAS, (("journal_mode", "WAL"),))
    monkeypatch.setattr(flower_patches, "_warned", set())
    assert not flower_patches.sqlite_busy_timeout(1000, {})
    assert not flower_patches.sqlite_busy_timeout(1000, {})
    assert getattr(sql_mixin, flower_patches.PRAGMAS) == (("journal_mode", "WAL"),)
    said = [r for r in caplog.records if "sqlite-busy-timeout" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING", said
    assert "holding busy_timeout" in said[0].getMessage()


def test_it_is_flowers_superlink_with_its_arguments():
    out = subprocess.run([sys.executable, "-m", "fedsys_launch.deploy.superlink", "--help"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith("usage: flower-superlink") and "--database" in out


class _State(SqlCoreState):
    """Flower's SQL core state (the SuperLink's) without the link-only parts."""

    # abstract in SqlCoreState, never reached by create_task / claim_task: a call fails the test
    def get_node_id(self) -> int:
        raise AssertionError("claim_task read a node id")

    def store_message_and_object_tree(self, *a, **k):
        raise AssertionError("claim_task stored a message")


def _claimed_window_s(tmp_path, name: str) -> float:
    """Seconds a freshly claimed ServerApp task may wait for its process to check in."""
    state = _State(str(tmp_path / name), ObjectStoreFactory().store())
    state.initialize()
    task_id = state.create_task(task_type=TaskType.SERVER_APP, run_id=1, fab_hash="f")
    assert task_id is not None and state.claim_task(task_id) is not None
    with state.session() as session:
        until = session.scalar(select(TaskModel.active_until).where(
            TaskModel.task_id == uint64_to_int64(task_id)))
    if until.tzinfo is None:
        until = until.replace(tzinfo=UTC)
    return (until - now()).total_seconds()


def test_a_claimed_serverapp_task_waits_the_start_window(monkeypatch, tmp_path):
    monkeypatch.setattr(SqlCoreState, "claim_task", SqlCoreState.claim_task)
    assert 25 < _claimed_window_s(tmp_path, "a.db") <= 30  # Flower 1.41's own
    assert flower_patches.superlink_start_window(300.0, {})
    assert 295 < _claimed_window_s(tmp_path, "b.db") <= 300
    assert flower_patches.superlink_start_window(1.0, {})  # never below Flower's
    assert 25 < _claimed_window_s(tmp_path, "c.db") <= 30
