"""Where a simulated client's time goes, from the server's send to the aggregated reply.

Runs ``fedsys run``'s machinery (Flower's simulation engine, Ray actors of one core each)
with probes and splits each train message's life into its parts:

===================  =====================================================================
push                 the ServerApp hands the message to the in-process SuperLink
to the runtime       until Flower's simulation runtime takes it from the LinkState (its
                     thread looks every 0.1 s)
queue                until a worker thread has a free ClientApp actor
Ray in               the worker hands message and Context to the actor (Ray task)
ClientApp            in the actor: config and the client's samples (``_setup``), the model
                     built and the message's weights loaded (``_load``), local training with
                     its optimiser (``run_trainer``), the reply's weights (``_weights`` and
                     ``train_reply``), the rest (Flower's dispatch, options, state records)
Ray out              the reply back to the worker
store                the reply into the LinkState
to the server        until the ServerApp's next pull sees it
===================  =====================================================================

and each round into the message window (first push to last pull), aggregation, central
evaluation and the rest (records, checkpoint).  The probes in this process wrap fedsys's
push and pull and Flower's runtime (``RayBackend.process_message``, ``InMemoryLinkState``);
in the actors a ClientApp wraps the fedsys one and times its steps by name.

Workloads:

* ``one-step``: a client whose training is one step of a tiny model (the 51k-weight MLP,
  batch 32), 10 iid clients, 200 test images: nearly all overhead.  With 1 client per
  round, the send-to-aggregated time is one client's overhead; with all 10 per round, the
  round divided by 10 is the cost per client when two actors share the work.
* ``make-run``: ``configs/default.yaml``'s FedAvg (FMNIST CNN, 5 of 20 clients of at most
  750 samples, 1 epoch of batch 32, 2,000 test images) and its FedSeq hop (one client,
  Adam, batch 64).

``--compare REV`` runs every workload also with the code of git revision REV (a temporary
``git worktree``), alternating the two, and reports the time per client of the steady rounds
side by side.  Without ``--compare`` it prints the breakdown of this checkout.

Usage::

    python benchmarks/client_overhead.py [--workloads one-step,make-run] [--rounds 12]
        [--compare REV] [--pairs 2] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

ONE_STEP = {"strategy": "fedavg", "dataset": "fashion-mnist", "model": "mlp", "num-clients": 10,
            "clients-per-round": 10, "partition": "iid", "local-steps": 1, "batch-size": 32,
            "test-subset": 200}
MAKE_RUN = {"strategy": "fedavg"}
MAKE_RUN_SEQ = {"strategy": "fedseq[lr=0.001;batch-size=64] as fedseq"}
Workload = tuple[str, str | None, dict[str, Any]]
WORKLOADS: dict[str, list[Workload]] = {
    "one-step": [("one-step, 1 client", None, {**ONE_STEP, "clients-per-round": 1}),
                 ("one-step, 10 clients", None, ONE_STEP)],
             "make-run": [("make-run FedAvg", "configs/default.yaml", MAKE_RUN),
                          ("make-run FedSeq hop", "configs/default.yaml", MAKE_RUN_SEQ)]}
#: the ClientApp's steps timed in the actors, by the name of the function in
#: fedsys_launch.apps.client_app (train_reply: fedsys.protocol's; load_model and
#: weights_record: fedsys_launch.apps.node_model's)
STEPS = {"_setup": "config + samples", "load_model": "model + weights", "run_trainer": "training",
         "weights_record": "reply weights", "train_reply": "reply weights"}
PARTS = ["push", "to the runtime", "queue", "Ray in", "config + samples", "model + weights",
         "training", "reply weights", "ClientApp rest", "Ray out", "store", "to the server"]


# ------------------------------------------------------------------ one traced run (child)

def _client_app(trace_dir: str, cfg: Any) -> Any:
    """A ClientApp that runs the fedsys one (admitting ``cfg`` as ``fedsys run`` does) and
    writes its steps' times per message."""
    from flwr.clientapp import ClientApp

    from fedsys import confine
    from fedsys_launch.apps.admission import Admission

    app = ClientApp()
    admission = Admission(confine.own_run_policy(cfg))

    def timed(msg: Any, context: Any, kind: str) -> Any:
        import fedsys_launch.apps.client_app as ca
        from fedsys import protocol
        from fedsys_launch.apps import node_model

        if not getattr(ca, "_bench_probes", False):
            ca._bench_probes = True  # type: ignore[attr-defined]
            ca._bench_times = {}  # type: ignore[attr-defined]
            home = {"train_reply": protocol, "load_model": node_model, "weights_record": node_model}
            for mod, name in [(home.get(n, ca), n) for n in STEPS]:
                fn = getattr(mod, name, None)
                if fn is None:
                    continue

                def probe(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
                    t = time.perf_counter()
                    try:
                        return _fn(*a, **k)
                    finally:
                        part = STEPS[_name]
                        ca._bench_times[part] = (ca._bench_times.get(part, 0.0)  # type: ignore[attr-defined]
                                                 + time.perf_counter() - t)
                setattr(mod, name, probe)
        ca._bench_times = {}  # type: ignore[attr-defined]
        handler = {"train": ca.train, "evaluate": ca.evaluate_handler, "query": ca.query}[kind]
        t0 = time.time()
        reply = handler(msg, context, admission=admission)
        t1 = time.time()
        with open(Path(trace_dir) / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps({"id": msg.metadata.message_id, "kind": kind, "start": t0,
                                "end": t1, **ca._bench_times}) + "\n")  # type: ignore[attr-defined]
        return reply

    app.train()(lambda msg, context: timed(msg, context, "train"))
    app.evaluate()(lambda msg, context: timed(msg, context, "evaluate"))
    app.query()(lambda msg, context: timed(msg, context, "query"))
    return app


def _probe_server(events: dict[str, dict[str, float]], rounds: list[dict[str, float]]) -> None:
    """Wrap fedsys's push and pull, Flower's runtime and the strategy's round steps; a
    message and a step belong to the round after the last record the strategy emitted."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    import fedsys.transport as transport
    from strategies.base import FedsysStrategy
    from strategies.loop import RoundLoop

    push, pull = transport._push, transport._pull
    now = {"round": 0.0}

    def _push(grid: Any, messages: list[Any]) -> list[str]:
        t = time.time()
        ids = push(grid, messages)
        for i in ids:
            events[i].update(push=t, pushed=time.time(), round=now["round"])
        return ids

    def _pull(grid: Any, ids: list[str]) -> list[Any]:
        got = pull(grid, ids)
        for m in got:
            events[m.metadata.reply_to_message_id]["pulled"] = time.time()
        return got

    transport._push, transport._pull = _push, _pull

    def wrap(cls: Any, name: str, key: Any) -> None:
        orig = getattr(cls, name)

        def probe(self: Any, *a: Any, **k: Any) -> Any:
            t = time.time()
            out = orig(self, *a, **k)
            key(t, a, out)
            return out
        setattr(cls, name, probe)

    def taken(t: float, a: Any, out: Any) -> None:
        for m in out:
            events[m.metadata.message_id]["taken"] = time.time()

    def worked(t: float, a: Any, out: Any) -> None:
        events[a[0].metadata.message_id].update(worker=t, worked=time.time())

    def stored(t: float, a: Any, out: Any) -> None:
        events[a[0].metadata.reply_to_message_id]["stored"] = time.time()

    wrap(InMemoryLinkState, "get_message_ins", taken)
    wrap(RayBackend, "process_message", worked)
    wrap(InMemoryLinkState, "store_message_res", stored)

    def step(name: str) -> Any:
        def note(t: float, a: Any, out: Any) -> None:
            rounds.append({"step": name, "round": now["round"],  # type: ignore[dict-item]
                           "seconds": time.time() - t})
        return note

    def emitted(t: float, a: Any, out: Any) -> None:
        now["round"] = float(a[0]["round"]) + 1
    wrap(RoundLoop, "emit", emitted)
    wrap(FedsysStrategy, "aggregate_train", step("aggregation"))
    wrap(RoundLoop, "evaluate", step("evaluation"))


def child(spec: dict[str, Any], out: Path) -> None:
    """Run one traced simulation and write its per-message and per-round numbers."""
    sys.path.insert(0, os.getcwd())
    from fedsys import metrics
    from fedsys.config import load_yaml
    from fedsys_launch.config_schema import build
    from fedsys_launch.engines.simulation import simulate

    layers = [load_yaml(ROOT / spec["config"])] if spec["config"] else []
    cfg = build(*layers, {**spec["settings"], "name": "bench", "output-dir": str(out / "runs"),
                          "num-server-rounds": spec["rounds"]})
    trace = out / "trace"
    trace.mkdir(parents=True)
    events: dict[str, dict[str, float]] = defaultdict(dict)
    steps: list[dict[str, float]] = []
    _probe_server(events, steps)
    simulate(cfg, client_app=_client_app(str(trace), cfg))
    actor = {}
    for f in trace.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            actor[d["id"]] = d
    label = cfg.strategies[0]
    recs = metrics.read_jsonl(cfg.run_dir / label / "metrics.jsonl")
    result = {"rounds": recs, "messages": [], "steps": steps}
    for mid, e in events.items():
        a = actor.get(mid)
        if a is None or a["kind"] != "train" or "pulled" not in e:
            continue
        in_app = sum(a.get(p, 0.0) for p in set(STEPS.values()))
        result["messages"].append({
            "round": e["round"], "push": e["push"], "pulled": e["pulled"],
            "seconds": e["pulled"] - e["push"], "parts": {
                "push": e["pushed"] - e["push"], "to the runtime": e["taken"] - e["pushed"],
                "queue": e["worker"] - e["taken"], "Ray in": a["start"] - e["worker"],
                **{p: a.get(p, 0.0) for p in dict.fromkeys(STEPS.values())},
                "ClientApp rest": a["end"] - a["start"] - in_app,
                "Ray out": e["worked"] - a["end"], "store": e["stored"] - e["worked"],
                "to the server": e["pulled"] - e["stored"]}})
    (out / "result.json").write_text(json.dumps(result))


# ------------------------------------------------------------------ driver

def run_traced(code: Path, label: str, config: str | None, settings: dict[str, Any],
               rounds: int) -> dict[str, Any]:
    """One traced run of ``code``'s fedsys in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="fedsys-bench-") as tmp:
        spec = {"config": config, "settings": settings, "rounds": rounds}
        env = {**os.environ, "PYTHONPATH": str(code), "FEDSYS_BENCH_SPEC": json.dumps(spec),
               "FEDSYS_BENCH_OUT": tmp}
        print(f"[{label}] {code} ...", flush=True)
        done = subprocess.run([sys.executable, __file__, "--child"], cwd=code, env=env,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"[{label}] run failed:\n{done.stderr[-3000:]}")
        out: dict[str, Any] = json.loads((Path(tmp) / "result.json").read_text())
        return out


def steady(result: dict[str, Any]) -> dict[str, float]:
    """Means over the steady rounds, from round 3 (round 1 starts the actors, round 2
    fills the per-process caches)."""
    recs = [r for r in result["rounds"] if r["round"] >= 3]
    msgs = [m for m in result["messages"] if m["round"] >= 3]
    if not recs or not msgs:
        raise SystemExit("benchmark invalid: no steady round (use --rounds 4 or more)")
    rt = statistics.mean(r["round-time"] for r in recs)
    clients = statistics.mean(r["clients-ok"] for r in recs)
    out = {"round": rt, "clients": clients, "per client": rt / clients,
           "message": statistics.mean(m["seconds"] for m in msgs)}
    for part in PARTS:
        out[part] = statistics.mean(m["parts"][part] for m in msgs)
    for name in ("aggregation", "evaluation"):
        spans = [s["seconds"] for s in result["steps"] if s["step"] == name and s["round"] >= 3]
        out[name] = statistics.mean(spans) if spans else 0.0
    by_round: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for m in msgs:
        by_round[m["round"]].append(m)
    out["window"] = statistics.mean(max(m["pulled"] for m in g) - min(m["push"] for m in g)
                                      for g in by_round.values())
    out["rest"] = out["round"] - out["window"] - out["aggregation"] - out["evaluation"]
    out["aggregated"] = out["window"] + out["aggregation"]
    return out


def ms(x: float) -> str:
    return f"{1000 * x:.1f}"


def breakdown_table(rows: list[tuple[str, dict[str, float]]]) -> str:
    head = "| part (ms; a train message, then a round: means over rounds 3..) | " + " | ".join(n for n, _ in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows)]
    for part in PARTS:
        lines.append(f"| {part} | " + " | ".join(ms(r[part]) for _, r in rows) + " |")
    lines.append("| **send to reply seen** | " + " | ".join(f"**{ms(r['message'])}**" for _, r in rows) + " |")
    lines.append("| round: first send to last reply | " + " | ".join(ms(r["window"]) for _, r in rows) + " |")
    lines.append("| round: aggregation | " + " | ".join(ms(r["aggregation"]) for _, r in rows) + " |")
    lines.append("| **round: first send to aggregated** | " + " | ".join(f"**{ms(r['aggregated'])}**" for _, r in rows) + " |")
    lines.append("| round: evaluation | " + " | ".join(ms(r["evaluation"]) for _, r in rows) + " |")
    lines.append("| round: the rest (messages built, records, checkpoint) | "
                 + " | ".join(ms(r["rest"]) for _, r in rows) + " |")
    lines.append("| **round** | " + " | ".join(f"**{ms(r['round'])}**" for _, r in rows) + " |")
    lines.append("| clients per round | " + " | ".join(f"{r['clients']:.0f}" for _, r in rows) + " |")
    lines.append("| **round / clients** | " + " | ".join(f"**{ms(r['per client'])}**" for _, r in rows) + " |")
    return "\n".join(lines)


def main() -> None:
    if "--child" in sys.argv:
        child(json.loads(os.environ["FEDSYS_BENCH_SPEC"]), Path(os.environ["FEDSYS_BENCH_OUT"]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="one-step,make-run",
                    help="comma-separated: one-step, make-run (default: both)")
    ap.add_argument("--rounds", type=int, default=12, help="rounds per run (default 12)")
    ap.add_argument("--compare", metavar="REV", help="also run git revision REV, alternating")
    ap.add_argument("--pairs", type=int, default=2, help="runs of each arm with --compare (default 2)")
    ap.add_argument("--record", action="store_true", help="write the tables into docs/performance.md")
    args = ap.parse_args()
    runs = [w for name in args.workloads.split(",") for w in WORKLOADS[name.strip()]]
    arms: list[tuple[str, Path]] = [("this checkout", ROOT)]
    worktree = None
    if args.compare:
        worktree = Path(tempfile.mkdtemp(prefix="fedsys-rev-"))
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree),
                        args.compare], check=True, capture_output=True)
        rev = subprocess.run(["git", "-C", str(worktree), "rev-parse", "--short", "HEAD"],
                             check=True, capture_output=True, text=True).stdout.strip()
        arms = [(f"before ({rev})", worktree), ("this checkout", ROOT)]
    try:
        results: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
        for k in range(args.pairs if args.compare else 1):
            for label, config, settings in runs:
                order = arms if k % 2 == 0 else arms[::-1]
                for arm, code in order:
                    res = run_traced(code, f"{label} / {arm}", config, settings, args.rounds)
                    results[(label, arm)].append(steady(res))
    finally:
        if worktree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                           check=False, capture_output=True)
    def merged(key: tuple[str, str]) -> dict[str, float]:
        rs = results[key]
        return {k: statistics.median(r[k] for r in rs) for k in rs[0]}

    text = []
    for arm, _ in arms:
        rows = [(label, merged((label, arm))) for label, _, _ in runs]
        text.append(f"{arm}:\n\n{breakdown_table(rows)}\n")
    if args.compare:
        lines = ["| workload | send to aggregated, before ms | now | now/before "
                 "| round / clients, before ms | now | now/before |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        for label, _, _ in runs:
            b, a = merged((label, arms[0][0])), merged((label, arms[1][0]))
            lines.append(f"| {label} | {ms(b['aggregated'])} | {ms(a['aggregated'])} | "
                         f"{a['aggregated'] / b['aggregated']:.2f} | {ms(b['per client'])} | "
                         f"{ms(a['per client'])} | {a['per client'] / b['per client']:.2f} |")
        text.append("\n".join(lines) + "\n")
    print("\n".join(text))
    if args.record:
        sys.path.insert(0, str(ROOT))
        import torch

        from fedsys_launch import recording

        cmd = "python benchmarks/client_overhead.py " + " ".join(sys.argv[1:])
        doc = ROOT / "docs" / "performance.md"
        recording.record_section(doc, "## Where a simulated client's time goes", cmd,
                               "\n".join(text), f"torch {torch.__version__}")
        print(f"recorded in {doc}")


if __name__ == "__main__":
    main()
