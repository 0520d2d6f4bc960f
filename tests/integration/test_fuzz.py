"""The fuzz suite: one hostile node in the real simulation engine sends, one per train
message, every malformed kind of reply (``hostile_app.KINDS``: NaN, +-Inf, wrong shape
and dtype, missing and extra records (a ConfigRecord beside them is a client's own, as in
Flower's tutorial, and used: tests/unit/test_base_strategy.py), a string or a list where a number belongs,
missing, negative, zero, fractional and huge ``num-examples``, a wrong ``partition-id``,
an empty reply) under every strategy.  Each is refused and logged with its reason,
every run finishes, every round's global model is finite, and the honest clients'
results are bit-identical to a run where that node contributes nothing at all.

A reply to a message that was never sent does not reach fedsys in the engine: Flower's
LinkState drops it (``Failed to store Message reply``); fedsys's own check of it is
tested in ``tests/unit/test_base_strategy.py`` with the ``reply_grid`` fixture."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from fedsys import metrics
from fedsys_launch.config_schema import build
from fedsys_launch.engines.simulation import simulate
from tests.integration.hostile_app import HOSTILE, KINDS, app, dead_app

pytestmark = pytest.mark.slow

PARALLEL = ["fedavg", "fedprox", "fedadam", "fedyogi", "fedavgm", "fedcda", "fedcross", "ima"]
CHAINS = ["fedelmy", "fedseq", "oneshot-fedavg", "fedelmy-parallel"]
PASSES = 10  # the hostile node gets 2 tries a pass: 20 malformed replies per chain
BASE = {"dataset": "synthetic", "model": "mlp", "partition": "iid", "lr": 0.05, "seed": 4,
        "num-clients": 3, "clients-per-round": 3, "num-server-rounds": len(KINDS),
        "strategy": ",".join(PARALLEL + CHAINS), "save-models": "global",
        "fedcda.warmup": 3, "fedcda.memory": 2, "ima.start-round": 8,
        "chain.passes": PASSES, "chain.warmup-epochs": 0, "fedelmy.pool-size": 2,
        "fedavgm.server-learning-rate": 0.5, "fedavgm.server-momentum": 0.9}
REASONS = {  # kind -> what the refusal says
    "nan": "holds NaN or Inf", "+inf": "holds NaN or Inf", "-inf": "holds NaN or Inf",
    "wrong-shape": "has shape", "wrong-dtype": "has dtype float64, expected float32",
    "no-arrays": "no ArrayRecord 'arrays'", "extra-arrays": "unexpected ArrayRecord(s) ['arrays-2']",
    "no-metrics": "lack 'num-examples'",
    "extra-metrics": "more than one MetricRecord ['metrics', 'metrics-2']",
    "string-metric": "no MetricRecord ('num-examples' is in ConfigRecord 'metrics'",
    "list-metric": "metric(s) ['train-loss'] are not numbers",
    "no-num-examples": "lack 'num-examples'", "negative-num-examples": "num-examples is -5",
    "zero-num-examples": "num-examples is 0", "fractional-num-examples": "not a whole number",
    "huge-num-examples": "claims num-examples 1e+12", "wrong-partition-id": "echoes partition-id 1",
    "empty": "no ArrayRecord 'arrays'",
}


def _run(tmp_path, name: str, client_app, caplog) -> list[str]:
    cfg = build({**BASE, "output-dir": str(tmp_path), "name": name})
    caplog.clear()
    with caplog.at_level(logging.INFO):
        simulate(cfg, client_app=client_app)
    return [r.getMessage() for r in caplog.records]


def _globals(tmp_path, name: str, label: str) -> list[tuple[str, dict[str, torch.Tensor]]]:
    files = sorted((tmp_path / name / label / "models").glob("global-r*.pt"))
    return [(f.name, torch.load(f)) for f in files]


def test_every_malformed_reply_is_refused_under_every_strategy(tmp_path, caplog):
    assert set(REASONS) == set(KINDS)
    logged = _run(tmp_path, "hostile", app, caplog)
    refusals = [m for m in logged if f"rejected reply of client {HOSTILE} " in m]
    for kind, reason in REASONS.items():
        assert any(reason in m for m in refusals), f"{kind}: no refusal saying {reason!r}"
    _run(tmp_path, "dead", dead_app, caplog)

    for label in PARALLEL + CHAINS:
        recs = metrics.read_jsonl(tmp_path / "hostile" / label / "metrics.jsonl")
        steps = [r for r in recs if r["round"] > 0]
        assert steps and all(math.isfinite(r["loss"]) for r in recs if "loss" in r), label
        mine = [m for m in refusals if m.startswith(f"[{label}] ")]  # logs name the run's label
        if label in PARALLEL:  # every round: the hostile reply refused, the two others used
            assert len(steps) == len(KINDS), label
            assert all(r["clients-ok"] == 2 and r["clients-rejected"] == 1 for r in steps), label
            assert len(mine) == len(KINDS), label
        elif label in ("fedelmy", "fedseq"):  # its hop tried twice, then skipped
            assert len(steps) == 3 * PASSES, label
            hops = [r for r in steps if r["client"] == HOSTILE]
            assert len(hops) == PASSES and all(r["hop-skipped"] == 1 for r in hops), label
            assert len(mine) == 2 * PASSES, label
        else:
            assert len(mine) >= PASSES, label
        ours, ref = _globals(tmp_path, "hostile", label), _globals(tmp_path, "dead", label)
        assert [n for n, _ in ours] == [n for n, _ in ref] and ours, label
        for (n, a), (_, b) in zip(ours, ref, strict=True):
            assert all(torch.isfinite(v).all() for v in a.values() if v.is_floating_point()), (label, n)
            assert all(torch.equal(a[k], b[k]) for k in a), f"{label} {n}: honest results changed"


#: issue 42 item 5: the finite attacks of fedsys's own ClientApp (``attack.*``,
#: fedsys/attacks.py) under every strategy: 5 rounds (chains: 2 passes of 3 hops)
FINITE = {**BASE, "num-server-rounds": 5, "ima.start-round": 2, "chain.passes": 2,
          "attack.clients": 1, "save-models": "none"}


@pytest.mark.parametrize("kind", ["scaled", "sign-flip", "inflated-count"])
def test_finite_attacks_under_every_strategy(tmp_path, caplog, kind):
    """x100 (refused by ``max-update-ratio`` against the round's other updates, a chain's
    hop against the hops before it), sign-flipped (an honest update's norm: taken, and
    the run stays finite), a fresh model claiming 20x its examples (within the old
    ``max-examples-ratio`` 100: cut in every weighted mean to ``max-weight-ratio`` 15 times
    the median of the others' claims; to half the mean by ``max-weight-share`` 0.5 before
    issue 77)."""
    from fedsys.attacks import attackers

    who = next(iter(attackers(FINITE["seed"], 1, FINITE["num-clients"])))
    cfg = build({**FINITE, "attack.kind": kind, "output-dir": str(tmp_path), "name": kind})
    caplog.clear()
    with caplog.at_level(logging.INFO):
        simulate(cfg, client_app=None)
    logged = [r.getMessage() for r in caplog.records]
    for label in PARALLEL + CHAINS:
        recs = metrics.read_jsonl(tmp_path / kind / label / "metrics.jsonl")
        steps = [r for r in recs if r["round"] > 0]
        assert steps and all(math.isfinite(r["loss"]) for r in recs if "loss" in r), label
        mine = [m for m in logged if m.startswith(f"[{label}] ")]
        refused = [m for m in mine if f"rejected reply of client {who} " in m]
        if kind == "scaled":
            assert all("max-update-ratio 20" in m for m in refused) and refused, label
            if label in PARALLEL:  # every round, against the two honest updates
                assert all(r["clients-rejected"] == 1 for r in steps), label
                assert len(refused) == len(steps), label
        elif kind == "sign-flip":
            assert not refused, label
        else:
            assert not refused, label
            if label in PARALLEL:  # every claim of 3 replies goes through the cap
                cut = [m for m in mine if f"client {who} " in m and "counted as" in m]
                assert len(cut) == len(steps), label
