"""FedCross in Flower's real simulation engine (Ray backend), synthetic data, tiny MLP.

* every node is sent, and receives, exactly the model of the slot it was given;
* a node whose ClientApp raises leaves its slot's model untouched;
* a killed FedCross run resumes to the same final weights as an uninterrupted one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord
from flwr.clientapp import ClientApp

from fedsys import checkpoint, metrics, protocol
from fedsys.fedcross import uniform_mean
from fedsys.params import Params, checksum
from fedsys_launch.apps import client_app as fedsys_client
from fedsys_launch.config_schema import build
from fedsys_launch.engines.simulation import simulate
from strategies.fedcross import FedCrossStrategy

pytestmark = pytest.mark.slow

BASE = {"dataset": "synthetic", "model": "mlp", "partition": "iid", "lr": 0.05,
        "num-clients": 3, "clients-per-round": 3, "num-server-rounds": 3, "seed": 5}
FAIL_PID, FAIL_ROUND = 1, 2

recording = ClientApp()


@recording.train()
def _train(msg: Message, context: Context) -> Message:
    """The fedsys client, plus the checksum of what it received; partition 1 raises in round 2."""
    rnd = int(msg.content["config"]["server-round"])  # type: ignore[arg-type]
    if int(context.node_config["partition-id"]) == FAIL_PID and rnd == FAIL_ROUND:
        raise RuntimeError("injected failure")
    got = checksum(protocol.from_record(msg.content["arrays"]))
    out = fedsys_client.train(msg, context)
    out.content["recv"] = ConfigRecord({"checksum": got})
    return out


@recording.query()
def _query(msg: Message, context: Context) -> Message:
    return fedsys_client.query(msg, context)


class RecordingFedCross(FedCrossStrategy):
    """FedCross that notes what it sends and what its slots were before and after."""

    sent: ClassVar[list[tuple[int, int, int, str]]] = []  # round, node, slot, checksum
    recv: ClassVar[dict[tuple[int, int], str]] = {}  # (round, node) -> checksum
    slots_log: ClassVar[list[tuple[int, dict[int, int], list[str], list[str]]]] = []

    def payload_for(self, node_id: int, partition_id: int, server_round: int) -> Params:
        p = super().payload_for(node_id, partition_id, server_round)
        RecordingFedCross.sent.append((server_round, node_id, self.assignment[node_id], checksum(p)))
        return p

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[Any, MetricRecord | None]:
        replies = list(replies)
        for r in replies:
            if not r.has_error() and "recv" in r.content.config_records:
                RecordingFedCross.recv[(server_round, r.metadata.src_node_id)] = str(
                    r.content.config_records["recv"]["checksum"])
                del r.content["recv"]  # this test's own record: fedsys refuses unexpected ones
        before = [checksum(s) for s in self.slots]
        out = super().aggregate_train(server_round, replies)
        RecordingFedCross.slots_log.append(
            (server_round, dict(self.assignment), before, [checksum(s) for s in self.slots]))
        return out


def test_each_node_trains_its_own_slot_and_a_failed_node_keeps_it(tmp_path, monkeypatch):
    from strategies import REGISTRY

    monkeypatch.setitem(REGISTRY, "fedcross", RecordingFedCross)
    RecordingFedCross.sent, RecordingFedCross.recv, RecordingFedCross.slots_log = [], {}, []
    cfg = build({**BASE, "output-dir": str(tmp_path), "name": "slots", "strategy": "fedcross"})
    simulate(cfg, client_app=recording)

    sent, recv, log = RecordingFedCross.sent, RecordingFedCross.recv, RecordingFedCross.slots_log
    assert [entry[0] for entry in log] == [1, 2, 3]
    for rnd, assignment, before, after in log:
        this = [(node, slot, cs) for r, node, slot, cs in sent if r == rnd]
        assert sorted(slot for _, slot, _ in this) == [0, 1, 2]  # a permutation of the slots
        for node, slot, cs in this:
            assert assignment[node] == slot
            assert cs == before[slot]  # the slot's model, as it was when sent
            if (rnd, node) in recv:
                assert recv[(rnd, node)] == cs  # ... and what the node received
        if rnd > 1:
            assert len({cs for _, _, cs in this}) == 3  # three different models went out
        failed = [slot for node, slot, _ in this if (rnd, node) not in recv]
        if rnd == FAIL_ROUND:
            (bad,) = failed
            assert after[bad] == before[bad]  # the failed node's slot is untouched
            assert all(after[i] != before[i] for i in range(3) if i != bad)
        else:
            assert failed == [] and all(a != b for a, b in zip(after, before, strict=True))

    recs = metrics.read_jsonl(tmp_path / "slots" / "fedcross" / "metrics.jsonl")
    assert [r["clients-ok"] for r in recs[1:]] == [3, 2, 3]
    assert [r["fedcross-uploads"] for r in recs[1:]] == [3, 2, 3]
    assert recs[-1]["accuracy"] > recs[0]["accuracy"]
    ck = checkpoint.load(tmp_path / "slots" / "fedcross" / "checkpoint.pt")
    slots = ck["strategy"]["fedcross"]["slots"]
    assert checksum(uniform_mean(slots)) == checksum(ck["strategy"]["params"])


def _fedsys(log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``fedsys ARGS`` in its own process group, its log in ``log`` (no pipe to fill)."""
    with log.open("wb") as err:
        return subprocess.Popen([sys.executable, "-m", "fedsys_launch", *args], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=err)


ROUNDS = 8


def test_killed_fedcross_run_resumes_to_identical_weights(tmp_path):
    strategy = "fedcross[fedcross.warmup=1;fedcross.dynamic-alpha-rounds=3]"
    label = "fedcross-warmup-1-dynamic-alpha-rounds-3"
    sets = [f"--set={k}={v}" for k, v in {**BASE, "output-dir": tmp_path, "strategy": strategy,
                                           "num-server-rounds": ROUNDS, "local-epochs": 8,
                                           "num-clients": 4}.items()]
    # Start-up (Ray) dominates: the reference runs beside the victim and its resume.
    ref = _fedsys(tmp_path / "ref.log", "run", *sets, "--set=name=ref")
    victim = _fedsys(tmp_path / "victim.log", "run", *sets, "--set=name=victim")
    ck = tmp_path / "victim" / label / "checkpoint.pt"
    deadline = time.time() + 240
    while time.time() < deadline:
        if ck.exists() and checkpoint.load(ck)["round"] >= 2:
            break
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)  # the whole process group: driver and Ray workers
    victim.wait(timeout=60)
    killed_at = checkpoint.load(ck)["round"]
    assert 2 <= killed_at < ROUNDS, "the kill must land mid-run"
    assert not (tmp_path / "victim" / label / "model.pt").exists()

    resumed = _fedsys(tmp_path / "resumed.log", "resume", str(tmp_path / "victim"))
    for proc, log in ((ref, "ref.log"), (resumed, "resumed.log")):
        assert proc.wait(timeout=300) == 0, (tmp_path / log).read_text()[-2000:]

    a = torch.load(tmp_path / "ref" / label / "model.pt")
    b = torch.load(tmp_path / "victim" / label / "model.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ra = metrics.read_jsonl(tmp_path / "ref" / label / "metrics.jsonl")
    rb = metrics.read_jsonl(tmp_path / "victim" / label / "metrics.jsonl")
    assert [r["round"] for r in rb] == list(range(ROUNDS + 1))
    for key in ("accuracy", "fedcross-alpha", "fedcross-collab-sim", "fedcross-slot-spread"):
        assert [r.get(key) for r in ra] == [r.get(key) for r in rb], key
    assert [r.get("fedcross-phase") for r in rb][1:] == [1.0] + [0.0] * (ROUNDS - 1)
    assert [r.get("fedcross-alpha") for r in rb][2:6] == pytest.approx([0.5, 0.5 + 0.49 / 3, 0.5 + 0.98 / 3, 0.99])
    sa = checkpoint.load(tmp_path / "ref" / label / "checkpoint.pt")["strategy"]["fedcross"]["slots"]
    sb = checkpoint.load(ck)["strategy"]["fedcross"]["slots"]
    assert [checksum(s) for s in sa] == [checksum(s) for s in sb]
