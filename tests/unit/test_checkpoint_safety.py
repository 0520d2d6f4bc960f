"""A checkpoint is read without running code (``fedsys.checkpoint``): a file whose
pickle would run a command is refused unread, by :func:`checkpoint.load` and by the
command line (``branch-from``, ``fedsys resume``), in one line naming it; a real
checkpoint still reads back bit for bit."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedsys import checkpoint
from fedsys.fedcda import Layout
from fedsys.validation import ClientUpdate
from fedsys_launch.commands.cli import main
from fedsys_launch.config_schema import build
from strategies.fedcda import FedCDAStrategy

SYSTEM = f"{os.system.__module__}.system"  # how a pickle names os.system (posix.system)
SETS = {"dataset": "synthetic", "model": "mlp", "num-clients": 3, "clients-per-round": 3,
        "num-server-rounds": 4, "seed": 5, "strategy": "fedavg"}


class Payload:
    """What an attacker pickles: unpickling it runs ``touch <marker>``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def crafted(path: Path, marker: Path) -> Path:
    """A ``torch.save`` archive that looks like a checkpoint and runs a command when
    ``torch.load(weights_only=False)`` reads it."""
    torch.save({"round": 1, "strategy": {}, "config": {}, "rng": Payload(marker)}, path)
    return path


def one_line_refusal(text: str, path: Path) -> None:
    assert text.count("\n") <= 1 and "Traceback" not in text, text
    assert str(path) in text, text
    assert f"holds Python code or objects a checkpoint does not ({SYSTEM})" in text, text


# ------------------------------------------------------------------ refused unread


def test_a_file_that_would_run_a_command_is_refused_unread(tmp_path):
    marker = tmp_path / "MARKER"
    path = crafted(tmp_path / "checkpoint.pt", marker)
    assert SYSTEM in torch.serialization.get_unsafe_globals_in_checkpoint(path)  # it would run
    with pytest.raises(checkpoint.UnsafeCheckpointError) as err:
        checkpoint.load(path)
    one_line_refusal(str(err.value), path)
    assert "refused unread" in str(err.value)
    assert isinstance(err.value, checkpoint.CheckpointError) and isinstance(err.value, ValueError)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_a_plain_pickle_that_would_run_a_command_is_refused_unread(tmp_path, protocol):
    # no zip archive: never handed to torch.load; its imports (GLOBAL, INST or
    # STACK_GLOBAL, by protocol) named from a static read
    marker = tmp_path / "MARKER"
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(pickle.dumps({"round": 1, "x": Payload(marker)}, protocol=protocol))
    with pytest.raises(checkpoint.UnsafeCheckpointError) as err:
        checkpoint.load(path)
    one_line_refusal(str(err.value), path)
    assert not marker.exists()


def test_scan_imports_names_what_a_pickle_imports_without_running_it(tmp_path):
    marker = tmp_path / "MARKER"
    obj = [Payload(marker), Payload(marker), np.zeros(2)]  # the second one by memo
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        by_global, other = checkpoint.scan_imports(io.BytesIO(pickle.dumps(obj, protocol)))
        assert SYSTEM in by_global | other, protocol
    assert checkpoint.scan_imports(io.BytesIO(b"not a pickle at all")) == (set(), set())
    assert not marker.exists()


def test_a_replaced_latest_checkpoint_is_not_worked_around_with_the_previous_one(tmp_path):
    marker = tmp_path / "MARKER"
    path = tmp_path / "checkpoint.pt"
    checkpoint.save(path, {"round": 1})
    checkpoint.save(path, {"round": 2})
    crafted(path, marker)
    with pytest.raises(checkpoint.UnsafeCheckpointError) as err:
        checkpoint.load_latest(path)
    one_line_refusal(str(err.value), path)
    assert not marker.exists()
    assert checkpoint.load(checkpoint.prev_path(path))["round"] == 1  # there, and not used


def test_a_layout_object_in_a_checkpoint_is_refused_unread(tmp_path):
    """A checkpoint holds FedCDA's layout as plain values; an object there is refused
    unread, naming its class, like any other."""
    layout = Layout.of({"w": np.zeros(3, np.float32), "n": np.array(1, np.int64)})
    path = tmp_path / "checkpoint.pt"
    torch.save({"round": 2, "format": checkpoint.FORMAT, "fedsys": "0.9", "strategy": {
        "fedcda": {"layout": layout}}}, path)
    with pytest.raises(checkpoint.UnsafeCheckpointError, match=r"fedsys\.fedcda\.Layout"):
        checkpoint.load(path)


def test_save_refuses_what_load_would_refuse(tmp_path):
    path = tmp_path / "checkpoint.pt"
    for bad, where in (({"round": 1, "strategy": {"x": np.float64(1.0)}},
                        "checkpoint['strategy']['x']: a numpy.float64"),
                       ({"round": 1, "s": {1, 2}}, "checkpoint['s']: a builtins.set"),
                       ({"round": 1, "a": [np.array([None])]},
                        "checkpoint['a'][0]: an array of dtype object"),
                       ({"round": 1, "l": Layout.of({"w": np.zeros(1, np.float32)})},
                        "checkpoint['l']: a fedsys.fedcda.Layout")):
        with pytest.raises(TypeError, match=f"cannot write {path}: .*"):
            checkpoint.save(path, bad)
        assert checkpoint.foreign(bad) == where
    assert list(tmp_path.iterdir()) == []  # nothing written


# ------------------------------------------------------------------ as a user


def _sets(**kw: object) -> list[str]:
    return [a for k, v in {**SETS, **kw}.items() for a in ("--set", f"{k}={v}")]


def test_fedsys_run_refuses_a_crafted_branch_from_in_one_line(tmp_path, capsys):
    marker = tmp_path / "MARKER"
    evil = crafted(tmp_path / "checkpoint-r0002.pt", marker)
    rc = main(["run", *_sets(**{"output-dir": tmp_path / "runs", "name": "child",
                                "branch-from": evil})])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.startswith("error: config key 'branch-from': ")
    one_line_refusal(err, evil)
    assert not marker.exists()
    assert not (tmp_path / "runs" / "child" / "fedavg" / "metrics.jsonl").exists()


def test_fedsys_resume_refuses_a_checkpoint_replaced_by_a_crafted_file(tmp_path, capsys):
    marker = tmp_path / "MARKER"
    cfg = build({**SETS, "output-dir": str(tmp_path), "name": "victim"})
    run = cfg.run_dir
    run.mkdir(parents=True)
    cfg.save(run / "config.yaml")
    ck = run / "fedavg" / "checkpoint.pt"
    checkpoint.save(ck, {"round": 1, "strategy": {}, "config": cfg.to_dict(),
                         "rng": checkpoint.rng_state()})  # the previous one: good
    crafted(ck, marker)
    rc = main(["resume", str(run)])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.startswith("error: cannot resume fedavg: ")
    one_line_refusal(err, ck)
    assert not marker.exists()


# ------------------------------------------------------------------ real checkpoints


def same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` equal bit for bit, types, dtypes and shapes included."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def updates(rnd: int) -> list[ClientUpdate]:
    rng = np.random.default_rng(rnd)
    return [ClientUpdate(100 + p, p, {"w": rng.normal(size=(2, 3)).astype(np.float32),
                                      "b": rng.normal(size=3).astype(np.float64),
                                      "count": np.array(rnd, np.int64)},
                         10 + p, {"train-loss": float(rng.uniform())})
            for p in sorted(rng.choice(5, size=3, replace=False).tolist())]


@pytest.mark.parametrize("cache", ["ram", "disk"])
def test_a_real_checkpoint_reads_back_bit_for_bit_and_resumes_exactly(tmp_path, cache):
    cfg = build({**SETS, "strategy": "fedcda", "num-clients": 5, "fedcda.warmup": 2,
                 "fedcda.cache": cache, "output-dir": str(tmp_path)})
    def in_dir(name: str) -> FedCDAStrategy:  # a disk cache of its own, as fedsys run gives
        return FedCDAStrategy.from_config(
            cfg.replace(**{"fedcda.cache-dir": str(tmp_path / name / "fedcda-cache")}))

    full = in_dir("full")
    part = in_dir("part")
    path = tmp_path / "part" / "checkpoint.pt"
    path.parent.mkdir(exist_ok=True)
    np.random.seed(3)  # noqa: NPY002 -- the global state a checkpoint keeps
    for rnd in range(1, 9):
        full.aggregate(rnd, updates(rnd))
        if rnd <= 5:
            part.params = part.aggregate(rnd, updates(rnd)).model
            part.round = rnd
        if rnd == 4:
            payload = {"round": rnd, "strategy": part.state_dict(), "config": cfg.to_dict(),
                       "rng": checkpoint.rng_state()}
            checkpoint.save(path, payload)
            part.checkpoint_written()
    # what the file needs beyond plain values and tensors: numpy's array and dtypes only
    with torch.serialization.safe_globals(checkpoint.SAFE_GLOBALS):
        assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == []
    got = checkpoint.load(path)
    assert same(got, {**payload, "format": checkpoint.FORMAT, "fedsys": checkpoint.version()})
    assert got["rng"]["numpy"][0] == "MT19937" and got["rng"]["numpy"][1].dtype == np.uint32
    # the global RNG state comes back exactly
    checkpoint.set_rng_state(got["rng"])
    first = np.random.random(4)  # noqa: NPY002
    checkpoint.set_rng_state(payload["rng"])
    assert np.array_equal(first, np.random.random(4))  # noqa: NPY002
    # killed after round 5; resumed from the file, it ends where the full run ends
    resumed = in_dir("part")
    resumed.load_state_dict(got["strategy"])
    assert resumed.layout == full.layout
    for rnd in range(5, 9):
        resumed.aggregate(rnd, updates(rnd))
    assert resumed.selected == full.selected
    a, b = resumed.global_model(), full.global_model()
    assert same(a, b) and same(resumed.sel_sum, full.sel_sum)


def test_layout_state_is_plain_and_round_trips():
    layout = Layout.of({"w": np.zeros((2, 3), np.float32), "n": np.array(1, np.int64)})
    state = layout.to_state()
    assert checkpoint.foreign(state) is None
    assert Layout.from_state(state) == layout
