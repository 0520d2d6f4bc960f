"""Setting up: the venv (``make``) and the Docker image, installed by pip against uv.

Arms, alternating so that drift in the machine's load and the network falls on both:

* ``venv-pip``: a fresh venv, ``pip install -e .[dev]`` (the Makefile before uv);
* ``venv-uv``: a fresh venv, ``pip install uv``, then ``uv pip install --compile-bytecode
  -e .[dev]`` with pip's configured constraint file (the Makefile now);
* with ``--docker REV``: ``docker build --no-cache`` of the server image from
  ``deploy/Dockerfile`` as it is at git revision ``REV`` (pip) and as it is now (uv), from
  the same local base image (``fedsys-base:bookworm``, made by ``scripts/docker_proof.sh``).

Nothing is cached: pip runs with ``--no-cache-dir``, uv with ``UV_NO_CACHE=1``, Docker with
``--no-cache``, so every arm downloads the wheels (about 3.5 GB with torch's CUDA libraries),
as a fresh CI machine does.  Per arm: wall seconds, and CPU seconds as ``/proc/stat``'s
user + system time of the whole machine (the Docker build runs in the daemon, not below this
process); niced work is left out, so run it on a machine idle but for niced jobs.  The venv
arms must install the same packages (``pip freeze`` compared).  ``--record`` writes the table
to ``docs/performance.md``.

Usage::

    python benchmarks/install.py [--pairs 2] [--docker REV] [--record]
"""

from __future__ import annotations

import argparse
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


from fedsys_launch import recording  # noqa: E402

UV_REQ = "uv>=0.12.20,<0.13"  # as the Makefile
BASE = "fedsys-base:bookworm"


def machine_cpu() -> float:
    """User + system CPU seconds of the whole machine since boot (niced time left out)."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    user, system, irq, softirq = (int(f[i]) for i in (1, 3, 6, 7))
    return (user + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def timed(cmds: list[list[str]], env: dict[str, str], log: Path) -> tuple[float, float]:
    """Run ``cmds`` one after another (each must succeed); wall and CPU seconds."""
    c0, t0 = machine_cpu(), time.perf_counter()
    with log.open("w") as out:
        for cmd in cmds:
            if subprocess.run(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                              check=False).returncode != 0:
                sys.exit(f"install: {' '.join(cmd)} failed; see {log}")
    return time.perf_counter() - t0, machine_cpu() - c0


def pip_constraints() -> list[str]:
    """``-c FILE`` for each constraint file pip is configured with (as the Makefile)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True, check=False).stdout
    files = [ln.split("=", 1)[1].strip("'") for ln in out.splitlines()
             if ln.split("=", 1)[0].endswith(".constraint")]
    return [a for f in files[-1:] for c in f.split() for a in ("-c", c)]


def venv_arm(kind: str, tmp: Path, i: int) -> tuple[float, float, str]:
    """Wall and CPU seconds of one fresh venv set up by ``kind``; its ``pip freeze``."""
    venv = tmp / f"{kind}-{i}"
    py = str(venv / "bin" / "python")
    base = sys.executable if sys.prefix == sys.base_prefix else \
        str(Path(sys.base_prefix) / "bin" / "python3")
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "UV_NO_CACHE": "1", "UV_NATIVE_TLS": "1"}
    env.pop("VIRTUAL_ENV", None)
    if kind == "venv-pip":
        cmds = [[base, "-m", "venv", str(venv)], [py, "-m", "pip", "install", "-q", "--upgrade", "pip"],
                [py, "-m", "pip", "install", "-q", "-e", ".[dev]"]]
    else:
        cmds = [[base, "-m", "venv", str(venv)], [py, "-m", "pip", "install", "-q", UV_REQ],
                [str(venv / "bin" / "uv"), "pip", "install", "-q", "--compile-bytecode",
                 "--python", py, *pip_constraints(), "-e", ".[dev]"]]
    wall, cpu = timed(cmds, env, tmp / f"{kind}-{i}.log")
    freeze = subprocess.run([py, "-m", "pip", "freeze", "--exclude-editable"],
                            capture_output=True, text=True, check=True).stdout
    shutil.rmtree(venv)
    return wall, cpu, freeze


def docker_arm(kind: str, tmp: Path, i: int, rev: str) -> tuple[float, float, str]:
    """Wall and CPU seconds of one ``docker build --no-cache`` of the server image."""
    dockerfile = ROOT / "deploy" / "Dockerfile"
    if kind == "docker-pip":
        dockerfile = tmp / "Dockerfile.before"
        dockerfile.write_text(subprocess.run(["git", "show", f"{rev}:deploy/Dockerfile"], cwd=ROOT,
                                             capture_output=True, text=True, check=True).stdout)
    tag = f"fedsys-bench-{kind}:{i}"
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    wall, cpu = timed([["docker", "build", "--no-cache", "--network", "host", "-f",
                        str(dockerfile), "--target", "server", "--build-arg", f"BASE={BASE}",
                        "-t", tag, "."]], env, tmp / f"{kind}-{i}.log")
    subprocess.run(["docker", "image", "rm", tag], capture_output=True, check=False)
    subprocess.run(["docker", "image", "prune", "-f"], capture_output=True, check=False)
    return wall, cpu, ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=2, help="runs of each arm (default 2)")
    ap.add_argument("--docker", metavar="REV", default="",
                    help="also build the server image with deploy/Dockerfile at git revision "
                         "REV (pip) and as it is now (uv)")
    ap.add_argument("--record", action="store_true", help="write the table to docs/performance.md")
    args = ap.parse_args()
    groups = [("venv-pip", "venv-uv")] + ([("docker-pip", "docker-uv")] if args.docker else [])
    runs: dict[str, list[tuple[float, float]]] = {k: [] for g in groups for k in g}
    freezes: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="fedsys-install-", dir="/var/tmp") as t:
        tmp = Path(t)
        for i in range(args.pairs):
            for pair in groups:
                for kind in pair if i % 2 == 0 else pair[::-1]:
                    if kind.startswith("venv"):
                        wall, cpu, freeze = venv_arm(kind, tmp, i)
                        freezes.add(freeze)
                    else:
                        wall, cpu, _ = docker_arm(kind, tmp, i, args.docker)
                    runs[kind].append((wall, cpu))
                    print(f"{kind:10s} run {i}: wall {wall:6.1f} s, CPU {cpu:6.1f} s", flush=True)
    if len(freezes) != 1:
        sys.exit("install: pip and uv installed different packages:\n" + "\n---\n".join(freezes))
    rows = [f"| arm (median of {args.pairs}) | pip wall s | uv wall s | uv/pip | pip CPU s "
            "| uv CPU s | uv/pip |", "|---|---:|---:|---:|---:|---:|---:|"]
    for pip_arm, uv_arm in groups:
        p = [statistics.median(r[j] for r in runs[pip_arm]) for j in (0, 1)]
        u = [statistics.median(r[j] for r in runs[uv_arm]) for j in (0, 1)]
        rows.append(f"| {pip_arm.split('-')[0]} | {p[0]:.0f} | {u[0]:.0f} | {u[0] / p[0]:.2f} "
                    f"| {p[1]:.0f} | {u[1]:.0f} | {u[1] / p[1]:.2f} |")
    table = "\n".join(rows)
    note = f"The venv arms installed the same {len(next(iter(freezes)).splitlines())} packages."
    print(table + "\n\n" + note)
    if args.record:
        cmd = "python benchmarks/install.py " + " ".join(sys.argv[1:])
        body = ("A fresh venv with the dev extra (`make`'s set-up) and, for `docker`, a "
                "`docker build --no-cache` of the server image from the local base, by pip "
                "(before) and by uv (now), alternating, nothing cached: each arm downloads "
                "torch with its CUDA libraries. CPU: the machine's user + system time from "
                "/proc/stat (niced work left out). In the image most of what is left is "
                "Docker committing a 6 GB layer.\n\n" + table + "\n\n" + note + "\n")
        doc = ROOT / "docs" / "performance.md"
        recording.record_section(doc, "## Setting up", cmd, body)
        print(f"recorded in {doc}")


if __name__ == "__main__":
    main()
