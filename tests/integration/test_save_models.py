"""Config key ``save-models`` (``fedsys_launch/apps/server_app.py``): from ``save-models-from`` on,
each round's global model and, with ``all``, every client model the round accepted, under
``<strategy>/models/``, as ``fedsys landscape`` reads them; read back and held against the
run's own record and final model."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from fedsys import metrics
from fedsys_launch.commands.cli import main


def test_save_models_all_keeps_each_rounds_global_and_accepted_client_models(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    sets = ["dataset=synthetic", "model=mlp", "num-clients=4", "clients-per-round=3",
            "strategy=fedavg", "engine=inprocess", "num-server-rounds=3", "save-models=all",
            "save-models-from=2", f"output-dir={out}", "name=kept"]
    assert main(["run", *(a for s in sets for a in ("--set", s))]) == 0
    run = out / "kept" / "fedavg"
    names = sorted(p.name for p in (run / "models").iterdir())
    assert not [n for n in names if "-r0001" in n]  # before save-models-from
    records = {int(r["round"]): r for r in metrics.read_jsonl(run / "metrics.jsonl")}
    for rnd in (2, 3):
        glob = torch.load(run / "models" / f"global-r{rnd:04d}.pt", weights_only=True)
        clients = {int(m.group(1)): torch.load(run / "models" / n, weights_only=True)
                   for n in names if (m := re.fullmatch(rf"client-r{rnd:04d}-p(\d{{4}})\.pt", n))}
        assert len(clients) == records[rnd]["clients-ok"] == 3
        assert set(clients) <= {0, 1, 2, 3}
        for key, g in glob.items():
            # FedAvg's new model is a weighted mean of the saved client models (Alg. 1): inside
            # their range weight by weight, and not any one of them (they were trained apart)
            stack = torch.stack([c[key] for c in clients.values()])
            assert torch.all(stack.min(0).values - 1e-6 <= g) and torch.all(g <= stack.max(0).values + 1e-6)
            assert not any(torch.equal(c[key], g) for c in clients.values())
    final = torch.load(run / "model.pt", weights_only=True)
    last = torch.load(run / "models" / "global-r0003.pt", weights_only=True)
    assert final.keys() == last.keys() and all(torch.equal(final[k], last[k]) for k in final)
