"""What the ``fedsys`` command sets for its own process: OpenMP threads that wait
passively (a user's own setting kept), and the heap frozen once after a run's first round."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SHOW = """
import os, sys
sys.argv = ["fedsys", "keys"]
from fedsys_launch.cli import main
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    main()
print(os.environ.get("OMP_WAIT_POLICY"))
"""


@pytest.mark.parametrize(("given", "want"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_command_makes_openmp_wait_passively_unless_told(given, want):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", SHOW], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout.split()
    assert out[-1] == want


FREEZE = """
import gc
from fedsys_launch import server_app
calls = []
real = gc.collect
gc.collect = lambda *a: calls.append(1) or real(*a)
assert gc.get_freeze_count() == 0
server_app.settle_heap()
frozen = gc.get_freeze_count()
server_app.settle_heap()
print(frozen > 10000, gc.get_freeze_count() == frozen, len(calls))
"""


def test_the_heap_is_collected_and_frozen_once_per_process():
    out = subprocess.run([sys.executable, "-c", FREEZE], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["True", "True", "1"]
