"""Where a command's CPU goes, by process name, from Linux process accounting.

Runs a command (e.g. ``bash .ci/run`` or the test suite) with process accounting switched
on (``accton``, Debian package ``acct``; needs root), then sums the user + system CPU of
every process that ended meanwhile by its name (``comm``: ``flwr-clientapp``,
``ray::ClientAppA``, ``python``, ...), niced or not, with counts and means.  Processes
still running at the end are not counted (the kernel writes a record when a process
ends).  ``--read FILE`` only reads an accounting file written before.  Processes under
``--exclude-tree PID`` (a background experiment) are left out.

Usage::

    python benchmarks/cpu_by_process.py [--top 15] [--exclude-tree PID] -- CMD ...
    python benchmarks/cpu_by_process.py --read /var/log/pacct
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def records(pacct: Path) -> dict[int, tuple[str, float, int]]:
    """``pid -> (comm, CPU seconds, ppid)`` from ``dump-acct`` (version 3 records)."""
    out = subprocess.run(["dump-acct", str(pacct)], capture_output=True, text=True,
                         check=True).stdout
    recs: dict[int, tuple[str, float, int]] = {}
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) >= 11 and f[1] == "v3":
            recs[int(f[9])] = (f[0], (float(f[2]) + float(f[3])) / 100.0, int(f[10]))
    return recs


def table(recs: dict[int, tuple[str, float, int]], exclude: set[int], top: int) -> str:
    """Markdown table of CPU by process name, largest first."""
    def excluded(pid: int) -> bool:
        for _ in range(64):
            if pid in exclude:
                return True
            if pid not in recs:
                return False
            pid = recs[pid][2]
        return False

    cpu: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    for pid, (comm, sec, _) in recs.items():
        if not excluded(pid):
            cpu[comm] += sec
            count[comm] += 1
    total = sum(cpu.values())
    ranked = sorted(cpu.items(), key=lambda kv: -kv[1])[:top]
    rows = ["| process name | processes | CPU s | mean s | share |", "|---|---:|---:|---:|---:|"]
    for comm, sec in ranked:
        rows.append(f"| `{comm}` | {count[comm]} | {sec:.0f} | {sec / count[comm]:.1f} | "
                    f"{sec / total:.0%} |")
    rest = total - sum(s for _, s in ranked)
    others = sum(count.values()) - sum(count[c] for c, _ in ranked)
    rows.append(f"| all others | {others} | {rest:.0f} | | {rest / max(total, 1e-9):.0%} |")
    rows.append(f"| **total** | {sum(count.values())} | {total:.0f} | | |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--read", type=Path, help="read this accounting file instead of running")
    ap.add_argument("--top", type=int, default=15, help="process names to list (default 15)")
    ap.add_argument("--exclude-tree", type=int, action="append", default=[], metavar="PID",
                    help="leave out processes below PID (repeatable)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not shutil.which("dump-acct") or not shutil.which("accton"):
        sys.exit("cpu_by_process: needs the acct package (apt-get install acct)")
    if args.read:
        print(table(records(args.read), set(args.exclude_tree), args.top))
        return
    if not cmd:
        sys.exit("cpu_by_process: give a command after --, or --read FILE")
    with tempfile.TemporaryDirectory(prefix="fedsys-acct-") as tmp:
        pacct = Path(tmp) / "pacct"
        pacct.touch()
        if subprocess.run(["accton", str(pacct)], capture_output=True, check=False).returncode:
            sys.exit("cpu_by_process: accton failed (process accounting needs root)")
        t0 = time.perf_counter()
        try:
            rc = subprocess.run(cmd, check=False).returncode
        finally:
            subprocess.run(["accton", "off"], capture_output=True, check=False)
        wall = time.perf_counter() - t0
        print(f"\n`{' '.join(cmd)}`: exit {rc}, wall {wall:.0f} s, {os.cpu_count()} cores\n")
        print(table(records(pacct), set(args.exclude_tree), args.top))


if __name__ == "__main__":
    main()
