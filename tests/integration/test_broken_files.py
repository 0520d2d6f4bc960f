"""Broken files under ``fedsys resume``: a truncated latest checkpoint falls back to the
previous one (saying so) and the run ends as an uninterrupted one; when neither can be
read, one error line names the file, says the run cannot be resumed, and no engine
starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fedsys import metrics

pytestmark = pytest.mark.slow
SETS = {"dataset": "synthetic", "model": "mlp", "partition": "iid", "num-clients": 3,
        "clients-per-round": 2, "local-epochs": 1, "lr": 0.05, "strategy": "fedavg"}


def _run(tmp, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedsys_launch", *args], capture_output=True,
                          text=True, timeout=600, check=False, cwd=tmp)


def _sets(tmp, **extra: object) -> list[str]:
    return [f"--set={k}={v}" for k, v in {**SETS, "output-dir": tmp, **extra}.items()]


def test_resume_falls_back_to_the_previous_checkpoint_or_says_it_cannot(tmp_path):
    ref = _run(tmp_path, "run", *_sets(tmp_path, name="ref", **{"num-server-rounds": 4}))
    assert ref.returncode == 0, ref.stderr[-2000:]
    part = _run(tmp_path, "run", *_sets(tmp_path, name="part", **{"num-server-rounds": 3}))
    assert part.returncode == 0, part.stderr[-2000:]
    ck = tmp_path / "part" / "fedavg" / "checkpoint.pt"
    data = ck.read_bytes()
    ck.write_bytes(data[:100])                                    # the latest is truncated
    log = tmp_path / "part" / "fedavg" / "metrics.jsonl"
    with log.open("a") as fh:                                     # and so is an append
        fh.write('{"strategy": "fedavg", "round": 4, "accur')
    res = _run(tmp_path, "resume", str(tmp_path / "part"), "--set", "num-server-rounds=4")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "truncated or corrupt" in out and "checkpoint.prev.pt (round 2)" in out
    a = torch.load(tmp_path / "ref" / "fedavg" / "model.pt")
    b = torch.load(tmp_path / "part" / "fedavg" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)               # rounds 3-4 redone exactly
    acc = [(r["round"], r.get("accuracy")) for r in metrics.read_jsonl(log)]
    ref_log = tmp_path / "ref" / "fedavg" / "metrics.jsonl"
    assert acc == [(r["round"], r.get("accuracy")) for r in metrics.read_jsonl(ref_log)]

    lines = log.read_text().splitlines(keepends=True)             # a line spoilt in the middle
    log.write_text("".join([*lines[:2], "{not json\n", *lines[3:]]))
    res = _run(tmp_path, "resume", str(tmp_path / "part"), "--set", "num-server-rounds=5")
    err = res.stdout + res.stderr
    assert res.returncode == 2
    assert f"cannot resume fedavg: {log} line 3 is not a JSON record" in err
    assert "Starting" not in err and "ray" not in err.lower()      # no engine started
    log.write_text("".join(lines))

    for f in (ck, ck.with_name("checkpoint.prev.pt")):
        f.write_bytes(b"\x00" * 50)
    res = _run(tmp_path, "resume", str(tmp_path / "part"), "--set", "num-server-rounds=5")
    err = res.stdout + res.stderr
    assert res.returncode != 0
    assert "cannot resume fedavg" in err and "cannot be resumed" in err
    assert "fedsys resume" not in err                              # never advised
    assert "Starting" not in err and "ray" not in err.lower()      # no engine started


def test_a_changed_or_truncated_fedcda_cache_file_stops_resume_before_any_engine(tmp_path):
    sets = _sets(tmp_path, name="cda", strategy="fedcda", **{
        "num-server-rounds": 3, "fedcda.cache": "disk", "fedcda.warmup": 1,
        "fedcda.memory": 2})
    done = _run(tmp_path, "run", *sets)
    assert done.returncode == 0, done.stderr[-2000:]
    cache = tmp_path / "cda" / "fedcda" / "fedcda-cache"
    files = sorted(cache.glob("c*-r*.npy"))
    assert files, "the disk cache holds the cached models"
    victim = files[-1]
    whole = victim.read_bytes()
    flipped = bytearray(whole)
    flipped[-5] ^= 0x10                                             # one bit, same length
    victim.write_bytes(bytes(flipped))
    res = _run(tmp_path, "resume", str(tmp_path / "cda"), "--set", "num-server-rounds=4")
    err = res.stdout + res.stderr
    assert res.returncode != 0
    assert f"{victim.name} has changed since it was written" in err and "cannot be resumed" in err
    assert "Starting" not in err and "ray" not in err.lower()
    victim.write_bytes(whole[:-8])                                  # truncated by 8 bytes
    res = _run(tmp_path, "resume", str(tmp_path / "cda"), "--set", "num-server-rounds=4")
    err = res.stdout + res.stderr
    assert res.returncode != 0
    assert "cannot resume fedcda" in err and victim.name in err and "cannot be resumed" in err
    assert "fedsys resume" not in err
    assert "Starting" not in err and "ray" not in err.lower()
