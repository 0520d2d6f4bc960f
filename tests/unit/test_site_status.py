"""``fedsys deploy status``'s sites table (fedsys_launch/deploy/site_status.py): which node is
which site, online or not, its last heartbeat and the run whose message it holds, read
from a database made with Flower's own schema."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy
from flwr.common.constant import HEARTBEAT_PATIENCE
from flwr.supercore.state.schema.linkstate_models import LinkStateBase

from fedsys_launch.deploy import site_status
from fedsys_launch.deploy.kits import REVOKED, SITE_FILE

BIG = (1 << 64) - 5  # an unsigned node id Flower stores as a negative signed one


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _db(path: Path) -> Path:
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    LinkStateBase.metadata.create_all(engine)
    with engine.begin() as con:
        for node, until, interval in ((11, 1000.0, 30.0), (BIG, 500.0, 10.0), (13, None, None)):
            con.execute(sqlalchemy.text(
                "INSERT INTO node (node_id, status, online_until, heartbeat_interval) "
                "VALUES (:n, 'online', :u, :i)"), {"n": _signed(node), "u": until, "i": interval})
        for mid, node, run in (("m1", 11, 7), ("m2", 11, 3), ("m3", BIG, 7)):
            con.execute(sqlalchemy.text(
                "INSERT INTO message_ins (message_id, run_id, dst_node_id) VALUES (:m, :r, :n)"),
                {"m": mid, "r": run, "n": _signed(node)})
    engine.dispose()
    return path


def test_activity_from_flowers_schema(tmp_path: Path) -> None:
    act = site_status.read_activity(_db(tmp_path / "superlink.db"))
    assert isinstance(act, dict)
    assert act[11] == site_status.Activity(1000.0 - HEARTBEAT_PATIENCE * 30.0, frozenset({3, 7}))
    assert act[BIG].runs == frozenset({7}) and act[BIG].heartbeat == 500.0 - HEARTBEAT_PATIENCE * 10
    assert act[13] == site_status.Activity(None, frozenset())
    assert "no database" in str(site_status.read_activity(tmp_path / "none.db"))
    (tmp_path / "bad.db").write_bytes(b"not a database at all" * 10)
    assert isinstance(site_status.read_activity(tmp_path / "bad.db"), str)


def test_the_sites_table(tmp_path: Path) -> None:
    for name, node, removed in (("a", 11, False), ("b", BIG, False), ("c", 13, True),
                                ("d", 14, False)):
        d = tmp_path / "sites" / name
        d.mkdir(parents=True)
        (d / SITE_FILE).write_text(json.dumps({"name": name, "node-id": node,
                                               "registered": f"2026-12-0{len(name)}"}))
        if removed:
            (d / REVOKED).write_text("gone\n")
    (tmp_path / "sites" / "broken").mkdir()
    (tmp_path / "sites" / "broken" / SITE_FILE).write_text("{")
    sites = site_status.registered_sites(tmp_path)
    assert [s["name"] for s in sites] == ["a", "b", "c", "d"]
    nodes = [{"node-id": "11", "status": "online"},
             {"node-id": str(BIG), "status": "offline", "offline-at": "2026-12-07 20:00:00Z"},
             {"node-id": "13", "status": "unregistered"}]
    act = site_status.read_activity(_db(tmp_path / "superlink.db"))
    rows = {r.name: r for r in site_status.site_rows(sites, nodes, act, [7], now=1000.0)}
    assert (rows["a"].state, rows["a"].run) == ("online", "7")  # run 3 ended: not shown
    assert rows["a"].last_seen == "1 min 0 s ago"
    assert (rows["b"].state, rows["b"].run) == ("offline", "7")
    assert rows["b"].last_seen == "8 min 40 s ago"
    assert (rows["c"].state, rows["c"].run) == ("removed", "-")
    assert (rows["d"].state, rows["d"].last_seen, rows["d"].run) == ("unknown", "never", "-")
    at = datetime(2026, 12, 7, 20, 5, tzinfo=UTC).timestamp()
    blind = site_status.site_rows(sites, nodes, "locked", [7], now=at)
    assert blind[0].run.startswith("?") and blind[0].last_seen == "never"
    assert blind[1].last_seen == "5 min 0 s ago"  # Flower's offline-at
    later = site_status.site_rows(sites, nodes, "locked", [7], now=at + 3600)
    assert later[1].last_seen == "2026-12-07 20:00 UTC"  # past an hour: the time


@pytest.mark.parametrize("v", [0, 1, (1 << 63) - 1, 1 << 63, BIG])
def test_ids_round_trip_flowers_signed_storage(v: int) -> None:
    assert site_status._uint64(_signed(v)) == v
