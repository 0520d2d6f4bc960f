"""Where a strategy of a run starts: afresh, resumed from its own checkpoint, or branched
from another run's kept checkpoint.

One place for each rule, used twice: by ``fedsys run`` / ``fedsys resume`` before any
engine starts (:func:`check`, so a broken checkpoint or a parent that differs is one
error line, not a failed run), and by the ServerApp when the strategy starts
(:func:`enter`).  What is method-specific comes from the strategy itself
(:meth:`strategies.base.FedsysStrategy.branch_late_keys` and
:meth:`~strategies.base.FedsysStrategy.branch_refusal`): nothing here names a method.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fedsys import checkpoint, metrics
from fedsys.config import ConfigError, RunConfig
from strategies.base import FedsysStrategy

#: Keys that never change the numbers of a run (where and how it is stored, which Ray
#: cluster it runs on: more workers cut a round's clients trained together into more
#: batches, which changes their numbers to float rounding only, as ``batch-clients`` does).
BRANCH_FREE = frozenset({"name", "about", "output-dir", "resume", "branch-from", "keep-checkpoint",
                         "checkpoint-every", "save-models", "save-models-from", "ray-address",
                         "tracking"})


def kept_checkpoint(out: Path, rnd: int) -> Path:
    """Where ``keep-checkpoint`` keeps the checkpoint of round ``rnd``."""
    return out / f"checkpoint-r{rnd:04d}.pt"


#: Stands for ``engine`` and ``batch-clients`` where runs are compared: what changes the
#: numbers is whether clients were trained together (to float rounding, not to the bit).
TOGETHER = "(clients trained together)"


def numbers_config(given: dict[str, Any]) -> dict[str, Any]:
    """``given`` (a run's config) with ``engine`` and ``batch-clients`` replaced by
    :data:`TOGETHER`: the two engines give the same numbers one client at a time.  ``auto``
    counts as together (whether it batched depends on the model and the device)."""
    out = {k: v for k, v in given.items() if k not in ("engine", "batch-clients")}
    out[TOGETHER] = (given["engine"] == "inprocess"
                     and str(given["batch-clients"]).lower() != "false")
    return out


@dataclass(frozen=True)
class StartPoint:
    """What a strategy of a run continues from."""

    kind: Literal["fresh", "resume", "branch"]
    ckpt: dict[str, Any] | None = None  #: the checkpoint's content (``None``: fresh)
    path: Path | None = None            #: the checkpoint file read
    note: str = ""                      #: a fallback to the previous checkpoint, said


def branch_point(cfg: RunConfig, strategy: FedsysStrategy) -> dict[str, Any]:
    """Load and check the checkpoint ``cfg.branch_from`` names, for ``strategy`` (built
    from ``cfg``).

    A branch is exact only if the parent run is this run up to the checkpoint's round:
    every key must be equal except :data:`BRANCH_FREE` ones and those the strategy says
    have not acted yet (:meth:`~strategies.base.FedsysStrategy.branch_late_keys`); a
    strategy may refuse branching altogether
    (:meth:`~strategies.base.FedsysStrategy.branch_refusal`).

    Raises
    ------
    ConfigError
        The file is missing or unreadable, holds more than a checkpoint does (refused
        unread: :class:`fedsys.checkpoint.UnsafeCheckpointError`), the two runs differ
        before its round, the round is not before the last, or the strategy cannot branch.
    """
    path = Path(cfg.branch_from).expanduser()
    if not path.is_file():
        raise ConfigError(f"config key 'branch-from': no checkpoint at {path} (keep one with "
                          "'keep-checkpoint: ROUND' in the parent run)")
    try:
        ckpt = checkpoint.load(path)
        parent, rnd = dict(ckpt["config"]), int(ckpt["round"])
    except checkpoint.UnsafeCheckpointError as exc:  # it names the file and what it holds
        raise ConfigError(f"config key 'branch-from': {exc}") from None
    except Exception as exc:
        raise ConfigError(f"config key 'branch-from': {path} is not a fedsys checkpoint "
                          f"({type(exc).__name__}: {exc})") from exc
    mine = numbers_config(cfg.to_dict())
    parent = numbers_config(parent)
    late = strategy.branch_late_keys(rnd)
    bad = sorted(k for k in set(mine) | set(parent)
                 if k not in BRANCH_FREE and k not in late and mine.get(k) != parent.get(k))
    if bad:
        detail = ", ".join(f"{k}: {parent.get(k)!r} there, {mine.get(k)!r} here" for k in bad)
        raise ConfigError(f"config key 'branch-from': {path} (round {rnd}) comes from a run "
                          f"that differs before that round ({detail})")
    if rnd >= cfg.num_server_rounds:
        raise ConfigError(f"config key 'branch-from': {path} is at round {rnd}, not before the "
                          f"last round {cfg.num_server_rounds}")
    if refusal := strategy.branch_refusal():
        raise ConfigError(f"config key 'branch-from': {refusal}")
    return ckpt


def strategy_config(cfg: RunConfig, out: Path) -> RunConfig:
    """``cfg`` as its strategy is built from it in the results directory ``out``: FedCDA's
    disk cache (``fedcda.cache: disk``, no ``fedcda.cache-dir``) in ``out/fedcda-cache``,
    where a resume finds it (the strategy alone would take a temporary directory)."""
    if cfg.get("fedcda.cache") != "disk" or cfg.get("fedcda.cache-dir"):
        return cfg
    return cfg.replace(**{"fedcda.cache-dir": str(out / "fedcda-cache")})


def start_point(cfg: RunConfig, out: Path, strategy: FedsysStrategy) -> StartPoint:
    """Where ``strategy`` (built from ``cfg``, results in ``out``) starts: its own latest
    readable checkpoint under ``resume``, the parent's under ``branch-from``, or afresh.

    Raises
    ------
    ConfigError
        Naming the strategy and what cannot be read.
    """
    ckpt_path = out / "checkpoint.pt"
    if cfg.resume and (ckpt_path.exists() or checkpoint.prev_path(ckpt_path).exists()):
        try:
            ckpt, path, note = checkpoint.load_latest(ckpt_path)
        except checkpoint.CheckpointError as exc:
            raise ConfigError(f"cannot resume {out.name}: {exc}") from None
        return StartPoint("resume", ckpt, path, note)
    if cfg.branch_from:
        return StartPoint("branch", branch_point(cfg, strategy),
                          Path(cfg.branch_from).expanduser())
    return StartPoint("fresh")


def load(strategy: FedsysStrategy, point: StartPoint, out: Path) -> None:
    """Restore ``strategy`` (its results directory ``out``) from ``point``.

    Raises
    ------
    ConfigError
        When the state, or what it refers to, cannot be restored.
    """
    if point.ckpt is None:
        return
    try:
        strategy.load_state_dict(point.ckpt["strategy"])
    except (OSError, ValueError, KeyError) as exc:
        if point.kind == "branch":
            raise ConfigError(f"config key 'branch-from': {point.path} cannot be loaded into "
                              f"{out.name} ({exc})") from None
        raise ConfigError(
            f"cannot resume {out.name}: {exc}; this strategy cannot be resumed: start the "
            f"run again, or remove {out} to run it afresh") from None


def check(cfg: RunConfig, out: Path, strategy: FedsysStrategy) -> str:
    """Everything :func:`enter` will read, read now (before any engine starts); the
    note to show (a fallback to the previous checkpoint), or ``""``.

    Raises
    ------
    ConfigError
        As :func:`start_point` and :func:`load`, and for a metrics log that a resume
        cannot keep.
    """
    point = start_point(cfg, out, strategy)
    load(strategy, point, out)
    if point.kind == "resume":
        try:
            metrics.read_jsonl(out / "metrics.jsonl")
        except metrics.MetricsFileError as exc:
            raise ConfigError(f"cannot resume {out.name}: {exc}; repair or remove "
                              "that line (the round it held is lost)") from None
    return point.note


def enter(cfg: RunConfig, out: Path, strategy: FedsysStrategy, label: str) -> StartPoint:
    """Start ``strategy`` where :func:`start_point` says: its state and the random
    generators restored, and its metrics log made to match (the rounds logged after the
    checkpoint dropped; a branch's log the parent's rounds up to the branch point, a
    fresh start's log emptied).  Returns the start point (the round it continues after
    is ``strategy.round``)."""
    point = start_point(cfg, out, strategy)
    load(strategy, point, out)
    log_file = out / "metrics.jsonl"
    if point.ckpt is not None:
        checkpoint.set_rng_state(point.ckpt["rng"])
    if point.kind == "resume":
        kept = [r for r in metrics.read_jsonl(log_file) if r["round"] <= strategy.round]
        metrics.write_jsonl(log_file, kept)
    elif point.kind == "branch":
        assert point.path is not None
        src = point.path.parent / "metrics.jsonl"
        kept = [{**r, "strategy": label} for r in metrics.read_jsonl(src)
                if r["round"] <= strategy.round] if src.exists() else []
        metrics.write_jsonl(log_file, kept)
    else:
        log_file.unlink(missing_ok=True)
    return point


__all__ = ["BRANCH_FREE", "StartPoint", "branch_point", "check", "enter", "kept_checkpoint",
           "load", "start_point"]
