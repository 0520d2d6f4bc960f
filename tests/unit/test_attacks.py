"""Issue 42 item 4: the attackers of a robustness experiment (``attack.*``), golden on their
maths and through the fedsys ClientApp's real train handler: an attacker's reply is the
honest reply transformed as its kind says, an honest node's is untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, RecordDict

from fedsys import attacks, task
from fedsys import protocol as proto
from fedsys.config import ConfigError
from fedsys.params import Params, flatten, from_torch
from fedsys_launch.apps import client_app
from fedsys_launch.config_schema import build

BASE = {"dataset": "synthetic", "model": "mlp", "num-clients": 4, "clients-per-round": 4,
        "partition": "iid", "local-steps": 2, "batch-size": 16, "lr": 0.05}


def test_attackers_are_seeded_distinct_and_bounded() -> None:
    a = attacks.attackers(3, 3, 10)
    assert a == attacks.attackers(3, 3, 10) and len(a) == 3 and a <= set(range(10))
    assert attacks.attackers(3, 1, 10) != attacks.attackers(4, 1, 10) or \
        attacks.attackers(3, 1, 10) != attacks.attackers(5, 1, 10)           # the seed draws them
    assert attacks.attackers(0, 0, 10) == frozenset()
    with pytest.raises(ValueError, match=r"attack\.clients 11 must be in 0\.\.10"):
        attacks.attackers(0, 11, 10)


def test_update_maths_golden() -> None:
    sent = {"w": np.array([1.0, 1.0], np.float32), "n": np.array(2, np.int64)}
    model = {"w": np.array([2.0, 0.5], np.float32), "n": np.array(7, np.int64)}
    up = attacks.scaled_update(model, sent, 100.0)
    assert np.allclose(up["w"], [101.0, -49.0]) and up["n"] == 7 and up["w"].dtype == np.float32
    flip = attacks.scaled_update(model, sent, -1.0)
    assert np.allclose(flip["w"], [0.0, 1.5])
    noisy = attacks.noise_update({"w": np.zeros(40000, np.float32)}, 0.5, 9)
    assert abs(float(np.std(noisy["w"])) - 0.5) < 0.01
    assert np.array_equal(noisy["w"], attacks.noise_update({"w": np.zeros(40000, np.float32)}, 0.5, 9)["w"])
    assert attacks.flip_labels(np.array([0, 3, 9]), 10).tolist() == [9, 6, 0]
    assert attacks.claimed_examples(120, 20.0) == 2400


def test_active_only_for_attackers_from_the_start_round() -> None:
    opts = attacks.AttackOptions(kind="scaled", clients=2, start_round=3)
    who = attacks.attackers(0, 2, 5)
    assert all(attacks.active(opts, 0, p, 5, 3) == (p in who) for p in range(5))
    assert not any(attacks.active(opts, 0, p, 5, 2) for p in range(5))
    assert not attacks.active(attacks.AttackOptions(kind="none", clients=5), 0, 0, 5, 9)


def test_config_refuses_more_attackers_than_clients_and_unknown_kinds() -> None:
    with pytest.raises(ConfigError, match=r"'attack\.clients' \(5\) must be <= num-clients \(4\)"):
        build({**BASE, "attack.clients": 5})
    with pytest.raises(ConfigError, match=r"attack\.kind.*allowed values: none, scaled"):
        build({**BASE, "attack.kind": "backdoor"})


def _weights(cfg_seed: int) -> Params:
    return from_torch(task.model(build({**BASE, "seed": cfg_seed})).state_dict())


def _context(run: dict, pid: int) -> Context:
    return Context(run_id=1, node_id=100 + pid,
                   node_config={proto.PARTITION_ID: pid, proto.NUM_PARTITIONS: 4},
                   state=RecordDict(), run_config=dict(build({**BASE, **run}).to_dict()))


def _train(run: dict, pid: int, sent: Params) -> tuple[Params, int]:
    ctx = _context(run, pid)
    msg = proto.message(100 + pid, "train", sent, {proto.SERVER_ROUND: 2, proto.TRAINER: "sgd",
                                                   proto.STATE_SCOPE: "t"})
    msg.metadata.__dict__["_message_id"] = f"train-{pid}"
    reply: Message = client_app.app(msg, ctx)
    return (proto.from_record(reply.content.array_records[proto.ARRAYS]),
            int(reply.content.metric_records[proto.METRICS][proto.NUM_EXAMPLES]))


@pytest.mark.parametrize("kind", [k for k in attacks.KINDS if k != "none"])
def test_client_app_attacker_replies_as_its_kind_says(kind: str) -> None:
    sent = _weights(1)
    who = sorted(attacks.attackers(0, 1, 4))
    honest_pid = next(p for p in range(4) if p not in who)
    run = {"attack.kind": kind, "attack.clients": 1}
    honest, n = _train({}, who[0], sent)
    attacked, m = _train(run, who[0], sent)
    bystander, _ = _train({}, honest_pid, sent)
    assert _train(run, honest_pid, sent)[0].keys() == bystander.keys()
    assert all(np.array_equal(v, bystander[k]) for k, v in _train(run, honest_pid, sent)[0].items())
    d_honest = flatten(honest) - flatten(sent)
    d_attack = flatten(attacked) - flatten(sent)
    if kind == "scaled":
        assert np.allclose(d_attack, 100 * d_honest, rtol=1e-3, atol=1e-4) and m == n
    elif kind == "sign-flip":
        assert np.allclose(d_attack, -d_honest, atol=1e-6) and m == n
    elif kind == "noise":
        assert abs(float(np.std(d_attack)) - 1.0) < 0.02 and m == n
    elif kind == "inflated-count":
        assert m == 20 * n and not np.allclose(flatten(attacked), flatten(honest))
        assert not np.allclose(flatten(attacked), flatten(sent))          # a fresh model
    else:  # label-flip: trained, on other labels
        assert m == n and not np.allclose(d_attack, d_honest) and float(np.linalg.norm(d_attack)) > 0
    assert torch.isfinite(torch.from_numpy(flatten(attacked))).all()


def test_every_strategy_of_a_run_meets_the_same_attackers() -> None:
    """The ClientApp reads ``attack.*`` from the run config: a per-strategy value would be
    ignored, so it is refused."""
    with pytest.raises(ConfigError, match=r"may not change 'attack\.clients'.*attackers"):
        build({**BASE, "strategy": "fedavg[attack.clients=1]"})


def test_fewer_attackers_are_among_more_of_the_same_seed() -> None:
    for seed in range(5):
        assert attacks.attackers(seed, 1, 10) < attacks.attackers(seed, 3, 10)


def test_an_inflated_count_attacker_declares_the_inflated_size_in_the_query() -> None:
    """Its claims then agree with what it declared (an attacker lies consistently): only
    ``max-weight-ratio`` (``max-weight-share`` where set) stands between it and the mean,
    not the declared-size check."""
    who = next(iter(attacks.attackers(0, 1, 4)))
    run = {"attack.kind": "inflated-count", "attack.clients": 1}

    def declared(r: dict, pid: int) -> int:
        reply = client_app.app(proto.query_message(100 + pid), _context(r, pid))
        return int(reply.content.metric_records[proto.METRICS][proto.NUM_EXAMPLES])

    honest = declared({}, who)
    assert declared(run, who) == 20 * honest
    other = (who + 1) % 4
    assert declared(run, other) == declared({}, other)
    assert _train(run, who, _weights(1))[1] == 20 * honest
