"""``fedsys_launch.engines.shared_ray_cluster.ray_cluster`` tries a start that Ray gave up on again, and says
why when none started; no process of any attempt is left running."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fedsys_launch.engines import shared_ray_cluster
from fedsys_launch.process.supervision import alive

GAVE_UP = "echo 'Exception: The current node timed out during startup.'; exit 1"
STARTED = "echo 'Ray runtime started.'; exec sleep 600"


def _fake_starts(monkeypatch: pytest.MonkeyPatch, scripts: list[str]) -> list[subprocess.Popen[bytes]]:
    """``ray start`` replaced by shell scripts, one per attempt (in its own session, as
    the real one)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(root, log_path, num_cpus, worker_ports):
        with log_path.open("ab") as log:
            p = subprocess.Popen(["sh", "-c", scripts[len(procs)]], stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(p)
        return p, 40000 + len(procs)

    monkeypatch.setattr(shared_ray_cluster, "_start", start)
    return procs


def test_a_start_ray_gave_up_on_is_tried_again(tmp_path: Path, monkeypatch):
    procs = _fake_starts(monkeypatch, [GAVE_UP, STARTED])
    with shared_ray_cluster.ray_cluster(tmp_path) as address:
        assert address == "127.0.0.1:40002" and len(procs) == 2
        assert alive(procs[1].pid)
    assert not alive(procs[1].pid)
    log = (tmp_path / "ray-start.log").read_text()
    assert "timed out during startup" in log and "Ray runtime started" in log


def test_the_last_attempt_failing_says_why(tmp_path: Path, monkeypatch):
    procs = _fake_starts(monkeypatch, [GAVE_UP, GAVE_UP])
    with pytest.raises(RuntimeError, match=r"(?s)did not start \(exit status 1, attempt 2 of 2\)"
                                           r".*timed out during startup"):
        with shared_ray_cluster.ray_cluster(tmp_path, attempts=2):
            pass
    assert len(procs) == 2 and not any(alive(p.pid) for p in procs)
