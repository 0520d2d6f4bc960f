"""From an empty machine to a site online, with the kit: each step an operator and a site take.

A server and a site in network namespaces of their own (``tests/integration/netns.py``:
198.51.100.0/24, no route out, ``fl.example.org`` resolving to the server).  Steps, timed
one after the other, ``--repeats`` times, each repeat a new federation:

* *install* (with ``--install``): at the site, a clone of this checkout (``fedsys deploy``
  runs its ``deploy/`` scripts from a checkout; the clone is local, a network one adds its
  transfer) and a fresh venv with fedsys, Flower and torch from the package index, nothing
  cached (``pip install uv``, then ``uv pip install -e`` with ``UV_NO_CACHE=1``, as
  ``make`` does it); the site's steps then run that venv;
* *server kit*: ``fedsys deploy server-kit`` (CA, certificate, proxy configuration);
* *server up*: the kit's ``start.sh`` until the SuperLink answers ``flwr`` in its namespace;
* *site key*: ``fedsys deploy site-key`` at the site;
* *register*: ``fedsys deploy add-site`` at the server (``flwr supernode register``);
* *site online*: the site kit's ``start.sh`` until Flower lists the node online.

Run as root (``ip netns``).  Prints a Markdown table of medians (min-max); ``--session
FILE`` also writes the operator's commands of the first repeat and what they printed,
then ``deploy status``, ``remove-site`` and ``deploy status`` again (docs/deployment.md
§4 shows it), the temporary directory written as ``/srv``.

Usage::

    python benchmarks/site_online.py [--repeats 3] [--install] [--session FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsys_launch.deploy.flwr_cli import CONNECTION, console_script  # noqa: E402
from fedsys_launch.process.flower_env import FLWR_ENV  # noqa: E402
from tests.integration.netns import Netns, unavailable  # noqa: E402

ENV = {**os.environ, **FLWR_ENV}


def _ok(proc: subprocess.CompletedProcess[str], what: str) -> None:
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def _until(cond: object, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def install(into: Path) -> str:
    """A clone of this checkout and a fresh venv with fedsys, nothing cached; its python."""
    src = into.with_name("site-src")
    subprocess.run(["git", "clone", "-q", str(ROOT), str(src)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(into)], check=True)
    py = into / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-cache-dir",
                    "uv>=0.13.5,<0.14"], check=True)
    constraints = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                                 capture_output=True, text=True, check=False).stdout
    extra = [a for ln in constraints.splitlines() if ".constraint=" in ln
             for a in ("-c", ln.split("=", 1)[1].strip("'"))]
    subprocess.run([str(into / "bin" / "uv"), "pip", "install", "-q", "--python", str(py),
                    *extra, "-e", str(src), "flwr[simulation]==1.42.0"], check=True,
                   env={**os.environ, "UV_NO_CACHE": "1", "UV_NATIVE_TLS": "1"})
    return str(py)


def once(holder: Path, do_install: bool, session: list[str] | None = None
         ) -> dict[str, float]:
    t: dict[str, float] = {}
    net = Netns({"fl.example.org": "198.51.100.1"})
    logs = []
    try:
        net.add("srv", 1)
        net.add("site", 10)
        site_py = sys.executable
        if do_install:
            t0 = time.monotonic()
            site_py = install(holder / "site-venv")
            t["install"] = time.monotonic() - t0
        kit, site = holder / "kit", holder / "site"

        def fedsys(ns: str, py: str, *args: str) -> subprocess.CompletedProcess[str]:
            proc = net.run(ns, [py, "-m", "fedsys_launch", *args],
                           env={**ENV, "COLUMNS": "120"}, cwd=holder)
            if session is not None:
                who = "server" if ns == "srv" else ns
                text = f"{who}$ fedsys {' '.join(args)}\n{proc.stdout}{proc.stderr}"
                session.append(text.replace(str(holder), "/srv"))
            return proc

        t0 = time.monotonic()
        _ok(fedsys("srv", sys.executable, "deploy", "server-kit", "--name", "fl.example.org",
                   "--address", "198.51.100.1", "--out", str(kit), "--roots",
                   str(holder / "runs")), "server-kit")
        t["server kit"] = time.monotonic() - t0
        t0 = time.monotonic()
        logs.append((holder / "server.log").open("wb"))
        net.start("srv", ["bash", str(kit / "start.sh")], logs[-1],
                  env={**ENV, "PYTHON": sys.executable})

        def flwr_nodes() -> dict[str, str] | None:
            p = net.run("srv", [console_script("flwr"), "supernode", "list", CONNECTION, "--format",
                                "json"], env={**ENV, "FLWR_HOME": str(kit / "cli")})
            try:
                return {n["owner-name"] + n["node-id"]: n["status"]
                        for n in json.loads(p.stdout)["nodes"]}
            except (ValueError, KeyError):
                return None

        _until(lambda: flwr_nodes() is not None, 120, "the SuperLink")
        t["server up"] = time.monotonic() - t0
        t0 = time.monotonic()
        _ok(fedsys("site", site_py, "deploy", "site-key", "site", "--out", str(site)),
            "site-key")
        t["site key"] = time.monotonic() - t0
        t0 = time.monotonic()
        _ok(fedsys("srv", sys.executable, "deploy", "add-site",
                   str(site / "keys" / "site.pub"), "--kit", str(kit), "--partition-id", "0",
                   "--num-partitions", "1"), "add-site")
        t["register"] = time.monotonic() - t0
        shutil.copytree(kit / "sites" / "site", site / "kit")
        t0 = time.monotonic()
        logs.append((holder / "site.log").open("wb"))
        net.start("site", ["bash", str(site / "kit" / "start.sh")], logs[-1],
                  env={**ENV, "PYTHON": site_py})
        _until(lambda: "online" in (flwr_nodes() or {}).values(), 300, "the site online")
        t["site online"] = time.monotonic() - t0
        if session is not None:
            _ok(fedsys("srv", sys.executable, "deploy", "status", "--kit", str(kit)), "status")
            _ok(fedsys("srv", sys.executable, "deploy", "remove-site", "site", "--kit",
                       str(kit)), "remove-site")
            _until(lambda: "online" not in (flwr_nodes() or {}).values(), 120,
                   "the removed site offline")
            _ok(fedsys("srv", sys.executable, "deploy", "status", "--kit", str(kit)), "status")
    finally:
        net.remove()
        for fh in logs:
            fh.close()
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--install", action="store_true",
                    help="also time a fresh, uncached install of fedsys at the site")
    ap.add_argument("--session", metavar="FILE",
                    help="write the first repeat's operator session (commands and output)")
    args = ap.parse_args()
    if why := unavailable():
        raise SystemExit(f"needs network namespaces: {why}")
    runs = []
    for i in range(args.repeats):
        holder = Path(tempfile.mkdtemp(prefix="fedsys-site-online-"))
        try:
            session: list[str] | None = [] if args.session and i == 0 else None
            runs.append(once(holder, args.install and i == 0, session))
            if session is not None:
                Path(args.session).write_text("\n".join(session))
        finally:
            shutil.rmtree(holder, ignore_errors=True)
        print(f"repeat {i + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in runs[-1].items()),
              flush=True)
    steps = list(dict.fromkeys(k for r in runs for k in r))
    print("\n| step | median s | min-max s | repeats |\n|---|---:|---:|---:|")
    for k in steps:
        v = [r[k] for r in runs if k in r]
        print(f"| {k} | {statistics.median(v):.1f} | {min(v):.1f}-{max(v):.1f} | {len(v)} |")
    kit_total = [sum(v for k, v in r.items() if k != "install") for r in runs]
    print(f"| kit steps in all | {statistics.median(kit_total):.1f} | "
          f"{min(kit_total):.1f}-{max(kit_total):.1f} | {len(kit_total)} |")


if __name__ == "__main__":
    main()
