"""launch/superlink.py: Flower's SuperLink with a longer SQLite busy timeout."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
from flwr.supercore import sql_mixin

from launch import superlink


def test_every_new_connection_waits_the_longer_timeout(monkeypatch, tmp_path):
    monkeypatch.setattr(sql_mixin, superlink.PRAGMAS, getattr(sql_mixin, superlink.PRAGMAS))
    conn = sqlite3.connect(tmp_path / "a.db")
    sql_mixin._set_sqlite_pragmas(conn, None)
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000  # Flower 1.41's own
    superlink.apply(superlink.busy_timeout_ms({}))
    conn = sqlite3.connect(tmp_path / "b.db")
    sql_mixin._set_sqlite_pragmas(conn, None)
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 120_000
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # the rest kept


def test_timeout_from_the_environment_and_bad_values_refused():
    assert superlink.busy_timeout_ms({superlink.ENV: "30000"}) == 30_000
    for bad in ("soon", "0", "-5"):
        with pytest.raises(SystemExit, match=superlink.ENV):
            superlink.busy_timeout_ms({superlink.ENV: bad})


def test_a_flower_without_the_pragma_is_refused():
    with pytest.raises(SystemExit, match="busy_timeout"):
        superlink.with_busy_timeout((("journal_mode", "WAL"),), 1000)


def test_it_is_flowers_superlink_with_its_arguments():
    out = subprocess.run([sys.executable, "-m", "launch.superlink", "--help"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith("usage: flower-superlink") and "--database" in out
