"""``flower-superexec`` whose app processes start warm.

In Flower 1.41/1.42 a SuperExec starts one app process per task: a node's SuperExec one
``flwr-clientapp`` per message the node answers, the server's one ``flwr-serverapp`` per
run (``SubprocessExecutor.launch``, a fresh interpreter each time).  Before such a process
does any work it imports Flower's app runtime and the app's libraries: about 5.5 s of CPU
per message on a 2-core machine, most of it torch (``benchmarks/warm_start.py``).

This entry point gives the SuperExec a fork server (:mod:`multiprocessing`'s
``forkserver``) that imports those libraries once, when the SuperExec starts, and forks
each app process from it: the app process runs the same Flower command with the same
arguments (``flwr-clientapp --runtime-api-address ... --token ...``, its process title
set to that command line), with only the library imports already done.  Nothing of the
app itself is imported ahead: the app's packages come from the FAB the app process
installs, as in a fresh process (any of fedsys's own packages the fork server holds are
dropped in the child first).  Each child seeds Python's and NumPy's global random state
afresh from the OS, as a new interpreter does; torch's default generator is untouched in
the fork server, so it starts where a new interpreter's does.  Nothing initialises CUDA
before the fork: each app process picks its GPU (``CUDA_VISIBLE_DEVICES``) as before.

``FEDSYS_APP_PRELOAD`` names the modules to import ahead, comma-separated (default
``torch,numpy``, those of them that are installed); set it empty to start every app
process as Flower does.  Then it runs Flower's own ``flower-superexec`` with the same
arguments.

Used by ``fedsys deploy`` (:mod:`fedsys_launch.deploy`) and the images' SuperExecs as
``python -m fedsys_launch.superexec``.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import random
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from multiprocessing import forkserver
from typing import Any

import setproctitle

ENV = "FEDSYS_APP_PRELOAD"
DEFAULT_PRELOAD = ("torch", "numpy")
#: fedsys's own top-level packages: the app process imports them from its FAB
OWN_PACKAGES = frozenset({"fedsys_launch", "fedsys", "strategies", "clients"})


def preload_modules(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The modules the fork server imports ahead: ``FEDSYS_APP_PRELOAD`` (comma-separated;
    empty: none, i.e. no fork server; a name not installed is refused) or
    :data:`DEFAULT_PRELOAD`, those of it that are installed.  fedsys's own packages are
    refused (the app must come from its FAB)."""
    text = environ.get(ENV)
    names = DEFAULT_PRELOAD if text is None else tuple(
        n.strip() for n in text.split(",") if n.strip())
    own = [n for n in names if n.partition(".")[0] in OWN_PACKAGES]
    if own:
        raise SystemExit(f"{ENV}: {', '.join(own)} is fedsys's own code, which the app "
                         "process imports from its FAB; name libraries only")
    missing = [n for n in names if importlib.util.find_spec(n.partition(".")[0]) is None]
    if text is not None and missing:
        raise SystemExit(f"{ENV}: {', '.join(missing)} is not installed here")
    return [n for n in names if n not in missing]


def console_entry(command: str) -> Callable[[], object]:
    """The function behind the installed console script ``command`` (``flwr-clientapp``)."""
    found = entry_points(group="console_scripts", name=command)
    for ep in found:
        entry: Callable[[], object] = ep.load()
        return entry
    raise SystemExit(f"no console script {command!r} is installed")


def drop_own_modules(modules: dict[str, Any]) -> list[str]:
    """Remove fedsys's own packages from ``modules`` (``sys.modules``); their names."""
    gone = [n for n in modules if n.partition(".")[0] in OWN_PACKAGES]
    for name in gone:
        del modules[name]
    return gone


def run_app(argv: Sequence[str], quiet: bool) -> None:
    """In the forked child: run the Flower command ``argv`` as a fresh process would."""
    drop_own_modules(sys.modules)
    if quiet:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    setproctitle.setproctitle(" ".join(argv))
    sys.argv = list(argv)
    console_entry(os.path.basename(argv[0]))()


class WarmStarter:
    """Stands in for the :mod:`subprocess` module in Flower's ``SubprocessExecutor``:
    ``Popen(args)`` forks the app process from the fork server instead of executing a
    new interpreter."""

    DEVNULL = subprocess.DEVNULL

    def __init__(self, preload: list[str]) -> None:
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(preload)
        forkserver.ensure_running()  # the imports now, before the first task arrives

    def Popen(self, args: Sequence[str], stdout: object = None,  # noqa: N802 (subprocess's name)
              stderr: object = None) -> multiprocessing.process.BaseProcess:
        multiprocessing.active_children()  # reaps the app processes that have ended
        command = [str(a) for a in args]
        path = _installed(command[0])
        proc = self.context.Process(target=run_app, name=command[0],
                                    args=([path, *command[1:]], stdout == subprocess.DEVNULL))
        proc.start()
        return proc


def _installed(command: str) -> str:
    """The path of the console script ``command`` beside this interpreter, as Flower's
    ``Popen`` would find it on ``PATH``."""
    here = os.path.join(os.path.dirname(sys.executable), command)
    return here if os.path.exists(here) else command


def apply(environ: Mapping[str, str] = os.environ) -> WarmStarter | None:
    """Start the fork server and route Flower's ``SubprocessExecutor`` through it (the
    patch ``warm-app-processes`` of :mod:`fedsys_launch.flower_patches`); none when
    ``FEDSYS_APP_PRELOAD`` names nothing installed, or the patch does not fit this Flower
    (a WARNING: every app process then starts as Flower starts it)."""
    from fedsys_launch import flower_patches

    preload = preload_modules(environ)
    if not preload:
        return None
    started: list[WarmStarter] = []

    def start() -> Callable[..., object]:
        started.append(WarmStarter(preload))
        return started[0].Popen

    flower_patches.warm_app_processes(start, environ)
    return started[0] if started else None


def main() -> None:
    """Start the fork server, then hand over to Flower's ``flower-superexec``."""
    from flwr.supercore.cli import flower_superexec

    from fedsys_launch.console import hand_over

    apply()
    hand_over("flower-superexec", flower_superexec)


if __name__ == "__main__":
    main()
