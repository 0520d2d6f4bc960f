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

Used by ``fedsys deploy`` (:mod:`fedsys_launch.deploy.local_deployment`) and the images' SuperExecs as
``python -m fedsys_launch.deploy.superexec``.
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


def redacted(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of ``--token`` shown as ``***``: a process title is
    readable by every local user (``/proc/PID/cmdline``)."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--token":
            out[i + 1] = "***"
    return out


def token_of(argv: Sequence[str]) -> str | None:
    """The value of ``--token`` in ``argv``, if any."""
    args = list(argv)
    return args[args.index("--token") + 1] if "--token" in args[:-1] else None


def run_app(argv: Sequence[str], quiet: bool, key: bytes | None = None) -> None:
    """In the child: run the Flower command ``argv`` as a fresh process would, its title
    without the token, its Runtime calls signed with ``key`` (the task's, when the
    SuperExec has a secret)."""
    token = token_of(argv)
    if key is not None and token is not None:
        from fedsys_launch import flower_patches

        flower_patches.sign_task_calls({token: key})
    drop_own_modules(sys.modules)
    if quiet:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    setproctitle.setproctitle(" ".join(redacted(argv)))
    sys.argv = list(argv)
    console_entry(os.path.basename(argv[0]))()


class AppStarter:
    """Stands in for the :mod:`subprocess` module in Flower's ``SubprocessExecutor``:
    ``Popen(args)`` starts the app process from the fork server (``preload`` names
    modules) or as a fresh interpreter (``multiprocessing``'s spawn, no preload), its
    arguments, the task token among them, passed through a pipe rather than the command
    line.

    ``auth_secret`` is Flower's auth-scope secret of the SuperExec secret, once Flower's
    SuperExec has loaded it (:func:`fedsys_launch.flower_patches.private_task_tokens`):
    each app process then gets its task's key (:func:`fedsys_launch.runtime_auth.task_key`).
    """

    DEVNULL = subprocess.DEVNULL

    def __init__(self, preload: list[str]) -> None:
        self.auth_secret: bytes | None = None
        self.context: Any
        if preload:
            self.context = multiprocessing.get_context("forkserver")
            self.context.set_forkserver_preload(preload)
            forkserver.ensure_running()  # the imports now, before the first task arrives
        else:
            self.context = multiprocessing.get_context("spawn")

    def Popen(self, args: Sequence[str], stdout: object = None,  # noqa: N802 (subprocess's name)
              stderr: object = None) -> multiprocessing.process.BaseProcess:
        from fedsys_launch.runtime_auth import task_key

        multiprocessing.active_children()  # reaps the app processes that have ended
        command = [str(a) for a in args]
        token = token_of(command)
        key = (task_key(self.auth_secret, token)
               if self.auth_secret is not None and token is not None else None)
        path = _installed(command[0])
        proc = self.context.Process(target=run_app, name=command[0],
                                    args=([path, *command[1:]], stdout == subprocess.DEVNULL, key))
        proc.start()
        return proc


def _installed(command: str) -> str:
    """The path of the console script ``command`` beside this interpreter, as Flower's
    ``Popen`` would find it on ``PATH``."""
    here = os.path.join(os.path.dirname(sys.executable), command)
    return here if os.path.exists(here) else command


def apply(environ: Mapping[str, str] = os.environ) -> AppStarter:
    """Route Flower's ``SubprocessExecutor`` through an :class:`AppStarter` (the patch
    ``private-task-tokens`` of :mod:`fedsys_launch.flower_patches`; its fork server only
    where ``FEDSYS_APP_PRELOAD`` names modules that are installed and the patch
    ``warm-app-processes`` is not turned off).  A Flower release the patch does not fit
    stops the SuperExec: its app processes would show their tokens."""
    from fedsys_launch import flower_patches

    preload = preload_modules(environ)
    if preload and not flower_patches._usable("warm-app-processes",
                                              flower_patches.check_executor(), environ):
        preload = []
    started: list[AppStarter] = []

    def start() -> Callable[..., object]:
        started.append(AppStarter(preload))
        return started[0].Popen

    def secret(value: bytes) -> None:
        from flwr.supercore.auth import derive_auth_secret

        started[0].auth_secret = derive_auth_secret(value)

    flower_patches.private_task_tokens(start, secret, environ)
    return started[0] if started else AppStarter([])


def main() -> None:
    """Start the fork server, then hand over to Flower's ``flower-superexec``."""
    from flwr.supercore.cli import flower_superexec

    from fedsys_launch.process.console import hand_over

    apply()
    hand_over("flower-superexec", flower_superexec)


if __name__ == "__main__":
    main()
