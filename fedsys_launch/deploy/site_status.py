"""The operator's view of a federation's sites: online or not, last seen, the run each is in.

``fedsys deploy status`` joins three sources: the site kits (``sites/NAME/site.json``,
``REVOKED``: which node id is which site), Flower's ``flwr supernode list`` (a node's
status as Flower reports it) and the SuperLink's database, read only, for what the CLI
does not print: a node's last heartbeat (Flower keeps ``online_until``, the heartbeat
plus ``HEARTBEAT_PATIENCE`` intervals) and the runs of the messages it holds now (a
message stays in ``message_ins`` from the ServerApp's push until its reply is taken).
Where the database cannot be read the two columns say so instead of guessing.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flwr.common.constant import HEARTBEAT_PATIENCE

from fedsys_launch.deploy.kits import REVOKED, SITE_FILE


@dataclass(frozen=True)
class Activity:
    """What the SuperLink's database says of one node."""

    heartbeat: float | None = None     #: time of its last heartbeat (UNIX seconds)
    runs: frozenset[int] = field(default_factory=frozenset)  #: runs of messages it holds


@dataclass(frozen=True)
class SiteRow:
    """One line of the sites table."""

    name: str
    node_id: int
    state: str        #: online, offline, registered (never connected), removed, unknown
    last_seen: str
    run: str
    registered: str


def _uint64(v: int) -> int:
    """Flower stores node and run ids as signed 64-bit integers."""
    return v + (1 << 64) if v < 0 else v


def read_activity(db: Path) -> dict[int, Activity] | str:
    """Each node's :class:`Activity` from the SuperLink's SQLite database, opened read
    only; a string saying why not where it cannot be read."""
    if not db.exists():
        return f"no database at {db}"
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        return f"{db}: {exc}"
    try:
        nodes = con.execute("SELECT node_id, online_until, heartbeat_interval FROM node "
                            "WHERE node_id IS NOT NULL").fetchall()
        held = con.execute("SELECT DISTINCT dst_node_id, run_id FROM message_ins "
                           "WHERE dst_node_id IS NOT NULL AND run_id IS NOT NULL").fetchall()
    except sqlite3.Error as exc:  # another Flower's schema, or a locked database
        return f"{db}: {exc}"
    finally:
        con.close()
    runs: dict[int, set[int]] = {}
    for node, run in held:
        runs.setdefault(_uint64(int(node)), set()).add(_uint64(int(run)))
    out = {}
    for node, until, interval in nodes:
        beat = (float(until) - HEARTBEAT_PATIENCE * float(interval)
                if until is not None and interval else None)
        out[_uint64(int(node))] = Activity(beat, frozenset(runs.get(_uint64(int(node)), ())))
    return out


def registered_sites(root: Path) -> list[dict[str, Any]]:
    """The site kits under ``root/sites`` (their ``site.json``, ``removed`` added),
    in name order; a kit whose ``site.json`` cannot be read is left out."""
    out = []
    for f in sorted((root / "sites").glob(f"*/{SITE_FILE}")):
        try:
            info = json.loads(f.read_text())
            int(info["node-id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        info["removed"] = (f.parent / REVOKED).exists()
        out.append(info)
    return out


def _ago(t: float, now: float) -> str:
    """How long ago ``t`` was, short enough for a table cell; past an hour, the UTC time."""
    s = max(0, int(now - t))
    if s >= 3600:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"{s // 60} min {s % 60} s ago" if s >= 60 else f"{s} s ago"


def _iso(text: str | None) -> float | None:
    if not text or text == "N/A":
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def site_rows(sites: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]],
              activity: Mapping[int, Activity] | str, running: Iterable[int],
              now: float) -> list[SiteRow]:
    """The sites table.

    Parameters
    ----------
    sites : iterable of mapping
        :func:`registered_sites`.
    nodes : iterable of mapping
        ``flwr supernode list --format json``'s ``nodes``.
    activity : mapping or str
        :func:`read_activity`, or why it could not be read.
    running : iterable of int
        The runs Flower reports as running (``flwr ls``): a message of a run that ended
        is not the run a site is in.
    now : float
        The current time (UNIX seconds).
    """
    by_id = {int(n["node-id"]): n for n in nodes}
    live = set(running)
    rows = []
    for s in sites:
        nid = int(s["node-id"])
        node = by_id.get(nid)
        act = activity.get(nid, Activity()) if isinstance(activity, Mapping) else None
        if s.get("removed"):
            state = "removed"
        elif node is None:
            state = "unknown"
        else:
            state = str(node.get("status", "unknown"))
        seen = act.heartbeat if act is not None else None
        if seen is None and state == "offline":
            seen = _iso(node.get("offline-at") if node else None)
        if act is None:
            run = "? (database not read)"
        else:
            held = sorted(act.runs & live)
            run = ", ".join(str(r) for r in held) if held else "-"
        rows.append(SiteRow(str(s.get("name", "?")), nid, state,
                            _ago(seen, now) if seen is not None else "never",
                            run if state != "removed" else "-",
                            str(s.get("registered", "?"))))
    return rows
