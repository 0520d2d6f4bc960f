"""App processes forked warm (``fedsys_launch.deploy.superexec``) against started cold (Flower's own
``flower-superexec``: a fresh interpreter per message), on a real local deployment.

Each arm brings up ``fedsys deploy``'s topology (SuperLink, server SuperExec, N
SuperNodes with their SuperExecs, 127.0.0.1, insecure), submits the same run (FedAvg then
FedCross, synthetic data, the MLP, ``--rounds`` rounds, every node every round), and tears
it down; ``FEDSYS_APP_PRELOAD`` empty gives the cold arm.  Arms alternate, ``--pairs``
times.  Measured: the machine's CPU while the run is under way (user + system from
``/proc/stat``, niced work included: run it on an idle machine), its wall time, and the
app processes it started (the messages the SuperNodes received, plus one ServerApp).
Checked: both arms end with the same models, bit for bit.

Usage::

    python benchmarks/warm_start.py [--pairs 2] [--nodes 2] [--rounds 2] [--record]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fedsys_launch.deploy import superexec  # noqa: E402
from fedsys_launch.deploy.local_deployment import LocalDeployment, node_name  # noqa: E402

STRATEGIES = ("fedavg", "fedcross")


def machine_cpu_s() -> float:
    """User + nice + system + irq + softirq seconds of the whole machine so far."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = sum(int(fields[i]) for i in (0, 1, 2, 5, 6))
    return ticks / os.sysconf("SC_CLK_TCK")


def arm(tmp: Path, warm: bool, nodes: int, rounds: int, tag: str) -> dict[str, float]:
    """One deployment up, one run, down; its CPU, wall time and app processes."""
    if warm:
        os.environ.pop(superexec.ENV, None)
    else:
        os.environ[superexec.ENV] = ""
    root = tmp / f"dep-{tag}"
    dep = LocalDeployment(root=root, num_nodes=nodes, roots=str(tmp / "runs"))
    dep.up()
    try:
        cfg = {"name": tag, "output-dir": str(tmp / "runs"), "strategy": ",".join(STRATEGIES),
               "dataset": "synthetic", "model": "mlp", "partition": "iid",
               "num-clients": nodes, "clients-per-round": nodes,
               "min-available-clients": nodes, "num-server-rounds": rounds,
               "local-steps": 5}
        time.sleep(5.0)  # the fork servers' imports are part of start-up, not of the run
        c0, t0 = machine_cpu_s(), time.monotonic()
        dep.flwr_cli.run(ROOT, cfg, timeout=1800)
        cpu, wall = machine_cpu_s() - c0, time.monotonic() - t0
        apps = 1 + sum(dep.log_file(node_name(i)).read_text(errors="replace")
                       .count("Receiving:") for i in range(nodes))
    finally:
        dep.down()
        os.environ.pop(superexec.ENV, None)
    return {"cpu": cpu, "wall": wall, "apps": apps}


def same_models(runs: Path, a: str, b: str) -> bool:
    for s in STRATEGIES:
        ma = torch.load(runs / a / s / "model.pt", weights_only=True)
        mb = torch.load(runs / b / s / "model.pt", weights_only=True)
        if ma.keys() != mb.keys() or not all(torch.equal(ma[k], mb[k]) for k in ma):
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--record", action="store_true", help="write docs/performance.md")
    args = ap.parse_args()
    res: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
    identical = True
    with tempfile.TemporaryDirectory(prefix="fedsys-warm-") as d:
        tmp = Path(d)
        for p in range(args.pairs):
            order = ("cold", "warm") if p % 2 == 0 else ("warm", "cold")
            for which in order:
                r = arm(tmp, which == "warm", args.nodes, args.rounds, f"{which}{p}")
                res[which].append(r)
                print(f"pair {p + 1}/{args.pairs} {which}: {r['cpu']:.1f} s CPU, "
                      f"{r['wall']:.1f} s, {r['apps']:.0f} app processes", flush=True)
            identical &= same_models(tmp / "runs", f"cold{p}", f"warm{p}")

    def med(which: str, key: str) -> float:
        return statistics.median(r[key] for r in res[which])

    apps = med("cold", "apps")
    rows = [
        f"| run CPU s | {med('cold', 'cpu'):.1f} | {med('warm', 'cpu'):.1f} | "
        f"{med('warm', 'cpu') / med('cold', 'cpu'):.2f} |",
        f"| run wall s | {med('cold', 'wall'):.1f} | {med('warm', 'wall'):.1f} | "
        f"{med('warm', 'wall') / med('cold', 'wall'):.2f} |",
        f"| CPU s saved per app process | | "
        f"{(med('cold', 'cpu') - med('warm', 'cpu')) / apps:.2f} | |",
    ]
    table = "\n".join(["| median of the pairs | cold (Flower's) | warm (forked) | warm/cold |",
                       "|---|---:|---:|---:|", *rows])
    verdict = ("Both arms ended with the same models, bit for bit." if identical
               else "THE ARMS' MODELS DIFFER.")
    print(table)
    print(verdict)
    if args.record:
        doc = ROOT / "docs" / "performance.md"
        cmd = "python benchmarks/warm_start.py " + " ".join(sys.argv[1:])
        section = (
            "## App processes forked warm\n\n"
            f"Command: `{cmd.replace(' --record', '')}`  \n"
            f"Machine: {os.uname().machine}, {os.cpu_count()} cores, "
            f"{time.strftime('%Y-%m-%d')}\n\n"
            f"A local deployment ({args.nodes} SuperNodes, insecure), FedAvg then FedCross, "
            f"{args.rounds} rounds, synthetic data, the MLP: {apps:.0f} app processes a run "
            "(one per message a SuperNode received, and the ServerApp).  Cold: Flower's "
            "`flower-superexec` starts a fresh interpreter for each; warm: "
            "`fedsys_launch.deploy.superexec` forks it from a fork server that imported torch and NumPy "
            f"once (`FEDSYS_APP_PRELOAD`).  {args.pairs} pairs, arms alternating.\n\n"
            f"{table}\n\n{verdict}\n")
        text = doc.read_text()
        start = text.find("## App processes forked warm")
        if start >= 0:
            end = text.find("\n## ", start + 1)
            text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
        else:
            text = text.rstrip("\n") + "\n\n" + section
        doc.write_text(text)
        print(f"recorded in {doc}")
    if not identical:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
