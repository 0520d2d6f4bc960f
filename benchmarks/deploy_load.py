"""Load on real processes: a local deployment (SuperLink, SuperExecs, N SuperNodes on
127.0.0.1, ``fedsys deploy``'s topology) at N = 10 and N = 30, and the faults a long
deployment meets.

Part ``load``: for each N, ``LocalDeployment.up`` starts everything, a FedAvg run with
every node in every round (``clients-per-round = N``; ``--per-round K`` samples K of the N
instead), Fashion-MNIST, the small CNN (``--model``), ``local-steps`` 10, is submitted
through ``flwr run``, and while it runs the proportional memory (PSS)
of the SuperLink and of every SuperNode (its SuperExec and the ClientApp
processes included) is sampled from ``/proc``.  Checked: every round used all the replies
it asked for (no reply lost, none refused).  Reported: the replies the SuperLink lost on the way that
the server asked for again (``transport-retries``), round time (median of the rounds
after the first), peak SuperLink memory, mean and largest peak per node, the whole
deployment's peak, against N.

Part ``faults`` (N = 10): (a) one SuperNode and its SuperExec are SIGKILLed after round
2 and restarted 5 s later: checked that rounds run on with the nodes there are and that
once it is back every round uses all N again (it rejoined and was sampled); (b) the
SuperLink and the server SuperExec are SIGKILLed after the checkpoint of round 3 and
restarted on the same state database, the run is submitted again with
``resume=true``, and its final model is compared with an uninterrupted run's.

Usage::

    python benchmarks/deploy_load.py [--nodes 10,30] [--rounds 4] [--part load|faults|all]
                                     [--record]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsys import metrics  # noqa: E402
from fedsys.options import ConfigError  # noqa: E402
from fedsys_launch import recording  # noqa: E402
from fedsys_launch.config_schema import build  # noqa: E402
from fedsys_launch.deploy.local_deployment import (  # noqa: E402
    SERVER_EXEC,
    SUPERLINK,
    LocalDeployment,
    node_exec_name,
    node_name,
)
from fedsys_launch.process.supervision import descendants  # noqa: E402


def pss_mib(pids: list[int]) -> float:
    """Summed proportional set size of ``pids`` (those still alive), MiB: shared pages
    (torch's libraries, mapped by every process) count once across processes, so the
    sums over nodes add up to what the machine holds."""
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except (OSError, IndexError, ValueError):
            pass
    return total / 2**20


class Sampler(threading.Thread):
    """Peak memory per group of components, sampled every ``every`` seconds."""

    def __init__(self, dep: LocalDeployment, groups: dict[str, list[str]], every: float = 0.5):
        super().__init__(daemon=True)
        self.dep, self.groups, self.every = dep, groups, every
        self.peak = {g: 0.0 for g in groups}
        self.whole = 0.0  # peak of the deployment's total at one sample
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            whole = 0.0
            for g, names in self.groups.items():
                pids = [d for n in names if self.dep.is_running(n)
                        for d in descendants(self.dep.components[n].pid)]
                now = pss_mib(pids)
                self.peak[g] = max(self.peak[g], now)
                whole += now
            self.whole = max(self.whole, whole)
            self.stop.wait(self.every)


def config(tmp: Path, name: str, n: int, rounds: int, per_round: int = 0,
           model: str = "fmnist-cnn", **extra: Any) -> Any:
    return build({"name": name, "output-dir": str(tmp / "runs"), "strategy": "fedavg",
                  "num-clients": n, "clients-per-round": min(per_round or n, n),
                  "num-server-rounds": rounds, "model": model, "local-steps": 10, "batch-size": 32,
                  "partition": "iid", "test-subset": 1000, "seed": 1,
                  "checkpoint-every": 1, **extra})


def records(cfg: Any) -> list[dict[str, Any]]:
    return metrics.read_jsonl(cfg.run_dir / "fedavg" / "metrics.jsonl")


def load_case(tmp: Path, n: int, rounds: int, nice: int, per_round: int = 0,
              model: str = "fmnist-cnn") -> dict[str, Any]:
    dep = LocalDeployment(tmp / f"deploy-{n}", num_nodes=n, node_nice=nice, roots=str(tmp))
    t0 = time.monotonic()
    dep.up(wait=900)
    up_s = time.monotonic() - t0
    groups = {SUPERLINK: [SUPERLINK], SERVER_EXEC: [SERVER_EXEC],
              **{f"node{i}": [node_name(i), node_exec_name(i)] for i in range(n)}}
    sampler = Sampler(dep, groups)
    sampler.start()
    cfg = config(tmp, f"load-{n}", n, rounds, per_round, model)
    k = cfg.clients_per_round
    try:
        t0 = time.monotonic()
        out = dep.flwr_cli.run(ROOT, cfg.to_dict(), timeout=3000)
        run_s = time.monotonic() - t0
    finally:
        sampler.stop.set()
        sampler.join()
        dep.down()
    recs = [r for r in records(cfg) if r["round"] > 0]
    if len(recs) != rounds:
        link = dep.log_file(SUPERLINK).read_text(errors="replace")
        raise RuntimeError(f"N = {n}: {len(recs)} of {rounds} rounds recorded; the run's "
                           f"output ends:\n{out[-3000:]}\nthe SuperLink's log ends:\n"
                           f"{link[-6000:]}")
    lost = [r["round"] for r in recs if r["clients-ok"] != k or r["clients-rejected"] != 0]
    # replies the SuperLink lost on the way and the server asked for again (resend_lost)
    asked = sum(int(k) for k in re.findall(r"round \d+: (\d+) train replies lost on the way",
                                           out))
    nodes = [v for k, v in sampler.peak.items() if k.startswith("node")]
    return {"n": n, "k": k, "rounds": len(recs), "lost": lost, "asked": asked, "up_s": up_s,
            "run_s": run_s,
            "round_s": statistics.median(r["round-time"] for r in recs[1:] or recs),
            "first_s": recs[0]["round-time"], "superlink": sampler.peak[SUPERLINK],
            "server": sampler.peak[SERVER_EXEC], "node_mean": statistics.mean(nodes),
            "node_max": max(nodes), "whole": sampler.whole / 1024,
            "acc": recs[-1]["accuracy"]}


def wait_round(cfg: Any, rnd: int, proc: Any, timeout: float = 1200) -> None:
    """Until round ``rnd`` is in the run's metrics (and its checkpoint written)."""
    end = time.monotonic() + timeout
    path = cfg.run_dir / "fedavg" / "metrics.jsonl"
    while time.monotonic() < end:
        if path.exists() and any(r["round"] >= rnd for r in metrics.read_jsonl(path)):
            time.sleep(1.0)  # the checkpoint follows the record
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended before round {rnd} (exit {proc.returncode})")
        time.sleep(0.5)
    raise RuntimeError(f"round {rnd} not reached in {timeout:.0f} s")


def finish(proc: Any, timeout: float = 1800) -> int:
    try:
        return int(proc.wait(timeout=timeout))
    except Exception:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def faults(tmp: Path, nice: int, n: int = 10, rounds: int = 7) -> list[str]:
    import torch

    dep = LocalDeployment(tmp / "deploy-faults", num_nodes=n, node_nice=nice, roots=str(tmp))
    dep.up(wait=600)
    lines = []
    try:
        # (a) a SuperNode killed after round 2, restarted 5 s later
        cfg = config(tmp, "node-restart", n, rounds)
        proc = dep.flwr_cli.submit(ROOT, cfg.to_dict(), tmp / "node-restart.log")
        wait_round(cfg, 2, proc)
        victim = n // 2
        dep.kill(node_exec_name(victim))
        dep.kill(node_name(victim))
        killed_at = max(r["round"] for r in records(cfg))
        time.sleep(5)
        dep.start(node_name(victim))
        dep.start(node_exec_name(victim))
        rc = finish(proc)
        recs = [r for r in records(cfg) if r["round"] > 0]
        ok = [int(r["clients-ok"]) for r in recs]
        back = next((i for i in range(len(ok)) if i >= killed_at and ok[i] == n), None)
        held = rc == 0 and len(recs) == rounds and back is not None and \
            all(x == n for x in ok[back:])
        lines.append(f"- SuperNode {victim} SIGKILLed after round {killed_at}, restarted 5 s later: "
                     f"exit {rc}, clients per round {ok}: "
                     + ("**holds**: it rejoined and was sampled in every round after"
                        if held else "**does not hold**"))
        # (b) the SuperLink killed after round 3's checkpoint, restarted, the run resumed
        ref = config(tmp, "reference", n, rounds)
        dep.flwr_cli.run(ROOT, ref.to_dict(), timeout=1800)
        cut = config(tmp, "superlink-restart", n, rounds)
        proc = dep.flwr_cli.submit(ROOT, cut.to_dict(), tmp / "superlink-restart.log")
        wait_round(cut, 3, proc)
        dep.kill(SERVER_EXEC)
        dep.kill(SUPERLINK)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        done_before = max(r["round"] for r in records(cut))
        dep.start(SUPERLINK)
        dep.start(SERVER_EXEC)
        dep.wait_online(n, 300)
        dep.flwr_cli.run(ROOT, {**cut.to_dict(), "resume": True}, timeout=1800)
        a = torch.load(ref.run_dir / "fedavg" / "model.pt", weights_only=True)
        b = torch.load(cut.run_dir / "fedavg" / "model.pt", weights_only=True)
        same = all(torch.equal(a[k], b[k]) for k in a)
        rec_a, rec_b = records(ref), records(cut)
        same_acc = [r["accuracy"] for r in rec_a] == [r["accuracy"] for r in rec_b]
        lines.append(f"- SuperLink and server SuperExec SIGKILLed after round {done_before}, "
                     f"restarted on superlink.db, run resubmitted with resume=true: "
                     f"{len(rec_b) - 1} rounds; final model "
                     + ("**bit-identical**" if same else "**differs**")
                     + " to an uninterrupted run's, per-round accuracies "
                     + ("identical" if same_acc else "differ"))
    finally:
        dep.down()
    for line in lines:
        print(line, flush=True)
    return lines


def _count(text: str) -> int:
    """A whole number >= 0 (argparse type): a bad --per-round is refused by name."""
    try:
        k = int(text)
    except ValueError:
        k = -1
    if k < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of SuperNodes, 0 for all")
    return k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="10,30", help="SuperNode counts of the load part")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--per-round", type=_count, default=0, metavar="K",
                    help="SuperNodes trained per round (default 0: all N)")
    ap.add_argument("--model", default="fmnist-cnn", help="model of the load runs")
    ap.add_argument("--part", choices=("load", "faults", "all"), default="all")
    ap.add_argument("--record", action="store_true", help="write docs/performance.md")
    ap.add_argument("--keep", metavar="DIR", default="",
                    help="work in DIR and keep it (deployments' logs, runs) instead of a "
                    "temporary directory")
    ap.add_argument("--node-nice", type=int, default=19,
                    help="niceness of the SuperNodes and their ClientApps (fedsys deploy up "
                    "--node-nice): 19 leaves the SuperLink the CPU on a machine with far "
                    "more nodes than cores")
    args = ap.parse_args()
    try:  # a bad --model is refused before any deployment starts
        config(Path(tempfile.gettempdir()), "check", 2, 1, 0, args.model)
    except ConfigError as e:
        ap.error(str(e))
    # SIGTERM unwinds like Ctrl-C, so every started deployment is taken down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = ["| SuperNodes | trained per round | rounds | rounds short of a reply | replies asked again | start-up s | first round s | round s "
            "(median after) | SuperLink MiB | server SuperExec MiB | per node MiB, mean | "
            "per node MiB, max | whole deployment GiB, peak | final acc |", "|---:" * 14 + "|"]
    fault_lines: list[str] = []
    failed: list[int] = []
    with tempfile.TemporaryDirectory(prefix="fedsys-load-") as d:
        tmp = Path(args.keep or d)
        tmp.mkdir(parents=True, exist_ok=True)
        if args.part in ("load", "all"):
            for n in (int(x) for x in args.nodes.split(",")):
                try:
                    r = load_case(tmp, n, args.rounds, args.node_nice, args.per_round,
                                  args.model)
                except RuntimeError as e:  # recorded as it is; the other cases still run
                    print(e, flush=True)
                    failed.append(n)
                    rows.append(f"| {n} | {args.per_round or n} | failed: "
                                + str(e).splitlines()[0] + " |" + " |" * 11)
                    continue
                line = (f"| {r['n']} | {r['k']} | {r['rounds']} | {len(r['lost'])} | {r['asked']} | "
                        f"{r['up_s']:.0f} | "
                        f"{r['first_s']:.1f} | {r['round_s']:.1f} | {r['superlink']:.0f} | "
                        f"{r['server']:.0f} | {r['node_mean']:.0f} | {r['node_max']:.0f} | "
                        f"{r['whole']:.1f} | {r['acc']:.3f} |")
                print(line, flush=True)
                rows.append(line)
        if args.part in ("faults", "all"):
            fault_lines = faults(tmp, args.node_nice)
    if args.record:  # each part replaces its own subsection, so the parts may run apart
        cmd = "python benchmarks/deploy_load.py " + " ".join(sys.argv[1:])
        head = recording.stamp(cmd)
        doc = ROOT / "docs" / "performance.md"
        text = doc.read_text()
        if len(rows) > 2:
            text = recording.replace_subsection(text, "## Deployment load", "### SuperNodes against N", head + (
                "FedAvg, the SuperNodes trained per round drawn from all N (all of them "
                f"unless that column says fewer; Fashion-MNIST, model {args.model}, "
                f"10 local steps), SuperNodes and ClientApps at niceness {args.node_nice}, "
                "peak proportional memory (PSS, shared pages split between the processes "
                "that map them) sampled from /proc every 0.5 s "
                "(a node: its SuperNode, SuperExec and ClientApp processes):\n\n"
                + "\n".join(rows) + "\n"))
        if fault_lines:
            text = recording.replace_subsection(text, "## Deployment load", "### Faults (10 SuperNodes)",
                                              head + "\n".join(fault_lines) + "\n")
        doc.write_text(text)
        print(f"recorded in {doc}")
    if failed:
        sys.exit(f"deploy_load: the run with {failed} SuperNodes failed (above)")


if __name__ == "__main__":
    main()
