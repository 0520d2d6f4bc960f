"""FedELMY and FedSeq in Flower's simulation engine, through ``fedsys run``: the chain
visits the clients in the seeded order of every pass, keeps a checkpoint after every
hop, counts the models and bytes it relays (spec §3: one model down and one up per
hop), resumes bit-identically after a SIGKILL mid-chain, and skips a site whose
training fails (tried twice) while the chain goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedsys import metrics
from fedsys import protocol as proto
from fedsys.chain import chain_order, relay_model_messages
from fedsys.params import from_torch
from fedsys.task import model
from fedsys_launch.config_schema import build

pytestmark = pytest.mark.slow
N, PASSES = 3, 2
SETS = {"dataset": "synthetic", "model": "mlp", "partition": "dirichlet", "dirichlet-alpha": 0.5,
        "dirichlet-min-size": 20, "num-clients": N, "clients-per-round": N, "seed": 5,
        "strategy": "fedelmy,fedseq", "chain.passes": PASSES, "chain.order": "permutation",
        "chain.reshuffle": True, "local-epochs": 1, "lr": 0.003, "batch-size": 32,
        "fedelmy.pool-size": 2, "test-subset": 300}


def _sets(tmp: Path, name: str, **extra: object) -> list[str]:
    return [f"--set={k}={v}" for k, v in {**SETS, "output-dir": tmp, "name": name, **extra}.items()]


def test_chain_order_traffic_checkpoints_and_resume(tmp_path, fedsys_cli):
    fedsys_cli.finish(fedsys_cli.start("run", *_sets(tmp_path, "ref")))
    orders = [chain_order(range(N), "permutation", 5, p, reshuffle=True) for p in range(PASSES)]
    size = sum(len(a.data) for a in proto.to_record(
        from_torch(model(build({k: v for k, v in SETS.items()})).state_dict())).values())
    for strategy in ("fedelmy", "fedseq"):
        recs = metrics.read_jsonl(tmp_path / "ref" / strategy / "metrics.jsonl")
        assert [r["round"] for r in recs] == list(range(N * PASSES + 1))
        hops = recs[1:]
        assert [r["client"] for r in hops] == [p for o in orders for p in o]
        assert [(r["pass"], r["hop"]) for r in hops] == [(p, h) for p in (1, 2) for h in (1, 2, 3)]
        assert all(r["hop-skipped"] == 0 and r["clients-ok"] == 1 for r in hops)
        assert all("accuracy" in r for r in recs)          # central evaluation after every hop
        last = hops[-1]
        assert last["models-down"] + last["models-up"] == relay_model_messages(N * PASSES)
        assert last["bytes-down"] == last["bytes-up"] == N * PASSES * size
        assert recs[-1]["accuracy"] > recs[0]["accuracy"] + 0.2
    elmy = metrics.read_jsonl(tmp_path / "ref" / "fedelmy" / "metrics.jsonl")[1:]
    seq = metrics.read_jsonl(tmp_path / "ref" / "fedseq" / "metrics.jsonl")[1:]
    # the pool trains S = 2 models per hop, FedSeq one (plus the first hop's warm-up)
    assert elmy[1]["trained-examples"] == 2 * seq[1]["trained-examples"]
    assert elmy[0]["pool-size"] == 3

    victim = fedsys_cli.start("run", *_sets(tmp_path, "victim", strategy="fedelmy"))
    ck = tmp_path / "victim" / "fedelmy" / "checkpoint.pt"
    held = fedsys_cli.kill_after(victim, ck, 2)
    assert 2 <= held < N * PASSES, "the kill must land mid-chain"
    fedsys_cli.finish(fedsys_cli.start("resume", str(tmp_path / "victim")))
    a = torch.load(tmp_path / "ref" / "fedelmy" / "model.pt")
    b = torch.load(tmp_path / "victim" / "fedelmy" / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra = metrics.read_jsonl(tmp_path / "ref" / "fedelmy" / "metrics.jsonl")
    rb = metrics.read_jsonl(tmp_path / "victim" / "fedelmy" / "metrics.jsonl")
    for key in ("accuracy", "loss", "client", "bytes-down", "train-loss"):
        assert [r.get(key) for r in ra] == [r.get(key) for r in rb], key


def test_a_site_that_always_fails_is_tried_twice_then_skipped(tmp_path, fedsys_cli):
    out = fedsys_cli.finish(fedsys_cli.start(
        "run", *_sets(tmp_path, "flaky", strategy="fedseq", trainer="flaky", **{
            "chain.passes": 1, "chain.order": "index", "plugins": "flaky_example",
            "flaky.partition": 1})))
    recs = metrics.read_jsonl(tmp_path / "flaky" / "fedseq" / "metrics.jsonl")[1:]
    assert [(r["client"], r["hop-skipped"], r["hop-tries"]) for r in recs] == [
        (0, 0, 1), (1, 1, 2), (2, 0, 1)]
    assert "site 1 crashed while training" in out
    assert "client 1 skipped after 2 tries" in out
    assert recs[2]["accuracy"] > recs[0]["accuracy"]   # client 2 trained on from client 0's model
