"""What the ``fedsys`` command sets for its own process (``fedsys_launch.commands.cli.command``, the
console script's entry point): OpenMP threads that wait passively (a user's own setting
kept), glibc's heap keeping freed memory (a user's own setting kept), and the heap frozen
once after a run's first round.  ``main(argv)`` sets none of it, with or without ``argv``."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fedsys_launch.process import heap

SHOW = """
import os, sys
sys.argv = ["fedsys", "keys"]
from fedsys_launch.commands import cli
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    cli.ENTRY()
print(os.environ.get("OMP_WAIT_POLICY"))
"""


@pytest.mark.parametrize(("entry", "given", "want"), [
    ("command", None, "PASSIVE"), ("command", "ACTIVE", "ACTIVE"), ("main", None, "None")])
def test_the_command_makes_openmp_wait_passively_unless_told(entry, given, want):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", SHOW.replace("ENTRY", entry)], capture_output=True,
                         text=True, env=env, timeout=120, check=True).stdout.split()
    assert out[-1] == want


def test_the_console_script_and_python_m_are_the_command():
    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"fedsys": "fedsys_launch.commands.cli:command"}
    assert "sys.exit(command())" in (root / "fedsys_launch" / "__main__.py").read_text()


FREEZE = """
import gc
from fedsys_launch.apps import server_app
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


HEAP = """
import ctypes, os, sys
sys.argv = ["fedsys", "keys"]
from fedsys_launch.process import heap
calls = []
real = heap.keep_freed_memory
heap.keep_freed_memory = lambda env: calls.append(real(env)) or calls[-1]
from fedsys_launch.commands.cli import command
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    command()
# where a block of 16 MiB comes from: glibc marks a chunk it mmapped in its size word
# (the word before the block, bit IS_MMAPPED = 2)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
p = libc.malloc(16 * 1024 * 1024)
mmapped = bool(ctypes.c_size_t.from_address(p - ctypes.sizeof(ctypes.c_size_t)).value & 2)
print(calls, "mmapped" if mmapped else "heap")
"""


@pytest.mark.parametrize(("given", "want"), [
    ({}, "[True] heap"),
    ({"MALLOC_TRIM_THRESHOLD_": "1000000"}, "[False] mmapped"),
    ({"GLIBC_TUNABLES": ""}, "[False] mmapped"),
])
def test_the_command_keeps_freed_memory_unless_the_user_tunes_the_heap(given, want):
    if not sys.platform.startswith("linux"):  # no glibc: nothing is set, whatever is given
        assert heap.keep_freed_memory(given) is False
        return
    env = {k: v for k, v in os.environ.items() if k not in heap.USER_SETTINGS} | given
    out = subprocess.run([sys.executable, "-c", HEAP], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout.splitlines()
    assert out[-1] == want


def test_the_thresholds_are_ones_glibc_takes():
    # mallopt refuses an mmap threshold above half its largest heap (32 MiB on 64-bit)
    assert heap.MMAP_THRESHOLD <= 32 * 1024 * 1024
    assert heap.TRIM_THRESHOLD >= heap.MMAP_THRESHOLD
    assert not heap.keep_freed_memory({"MALLOC_ARENA_MAX": "2"})


def test_outside_linux_the_heap_is_left_alone(monkeypatch):
    monkeypatch.setattr(heap.sys, "platform", "darwin")
    assert heap.keep_freed_memory({}) is False
