"""Output to a file or a pipe carries no colour codes; a terminal keeps them."""

from __future__ import annotations

import io
import logging
import os
import pty
import subprocess
import sys

from fedsys_launch.process import console

ESC = "\x1b["

# Flower's logger and a raw coloured write, as `fedsys` would see them
SCRIPT = """
import sys
from flwr.supercore import log
from logging import INFO, WARNING
from fedsys_launch.process.console import plain_when_redirected
plain_when_redirected()
log(INFO, "round 1 | acc 0.5")
log(WARNING, "rejected reply")
print("\\x1b[36m(ClientAppActor pid=1)\\x1b[0m trained", flush=True)
"""


def test_strip_ansi_removes_colours_and_cursor_moves_only():
    assert console.strip_ansi("\x1b[92mINFO \x1b[0m: ok \x1b[2K\x1b[1A[x] 5%") == "INFO : ok [x] 5%"


def test_a_redirected_stream_is_written_plain_and_says_it_is_no_terminal():
    buf = io.StringIO()
    plain = console.Uncoloured(buf)
    assert plain.write("\x1b[93mWARNING\x1b[0m x") == len("\x1b[93mWARNING\x1b[0m x")
    plain.writelines(["\x1b[1m a\n", "b\x1b[0m\n"])
    assert buf.getvalue() == "WARNING x a\nb\n" and not plain.isatty()
    plain.flush()  # the rest is the wrapped stream's


def test_piped_fedsys_output_has_no_colour_codes():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=True, env={**os.environ, "FLWR_LOG_LEVEL": ""})
    text = out.stdout + out.stderr
    assert "round 1 | acc 0.5" in text and "rejected reply" in text and "trained" in text
    assert ESC not in text


def test_a_terminal_keeps_its_colours():
    pid, fd = pty.fork()
    if pid == 0:  # the child writes to a terminal
        os.execvpe(sys.executable, [sys.executable, "-c", SCRIPT],
                   {k: v for k, v in {**os.environ, "FLWR_LOG_LEVEL": ""}.items()
                    if k != "NO_COLOR"})
    chunks = []
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    text = b"".join(chunks).decode()
    assert "round 1 | acc 0.5" in text and ESC in text


def test_flowers_handler_stops_colouring_when_its_stream_is_redirected(monkeypatch):
    from flwr.supercore.logger import ConsoleHandler

    buf = io.StringIO()
    handler = ConsoleHandler(colored=True, stream=buf)
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    monkeypatch.setattr(sys, "stderr", buf)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.delenv("NO_COLOR", raising=False)  # set by the call; undone after the test
    try:
        console.plain_when_redirected()
        assert handler.colored is False and isinstance(sys.stderr, console.Uncoloured)
        logging.getLogger("flwr").info("hello")
        assert buf.getvalue().endswith("hello\n") and ESC not in buf.getvalue()
    finally:
        logger.removeHandler(handler)
