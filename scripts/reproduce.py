"""The one driver of every reproduction behind docs/results/ (issue 43 item 3): experiments
as data, one seed of one setting at a time, resumable, records archived.

Each :class:`Experiment` is one setting of one results page, an entry of the experiment
matrix ``configs/experiments/matrix.yaml``: the ``fedsys`` commands that make it (presets and
``--set`` overrides), its seeds, the pre-trained starts it needs and what follows its runs.  The driver runs one unit (an experiment's seed) at a time:

- a unit whose records are in ``docs/results/data/`` already is skipped, so a finished seed is
  never run again, even on a machine without the ``runs/`` directory;
- a seed's strategies run one ``fedsys run`` each (``--set strategy=ENTRY``: every strategy of a
  run has the same partitions and seeds, so its numbers are those of the whole run), each
  archived as soon as it finishes, and a strategy whose record is archived is not run again:
  a seed of four hours carries across machines strategy by strategy (an experiment whose runs
  branch from each other's checkpoints runs its commands whole: the branches need ``runs/``);
  when every strategy of a seed has finished on this machine, its whole command runs once more,
  resuming each at its last round (no training), so that the seed's ``config.yaml``,
  ``results.md`` and plot list all its strategies (a run directory keeps its last command's);
- an interrupted one continues from its checkpoints (``--set resume=true``);
- a unit holds a lock (``runs/<group>/<setting>/seed-<k>.lock``): a second copy of the driver
  skips it (for a machine with cores to spare; on 2 cores one copy is as fast);
- after each command ``scripts/report.py <group>`` archives the finished runs' records and
  rewrites the page's generated sections (one writer at a time); a run with refused replies
  (the machine stalled it past ``round-timeout``) is moved aside there and the unit runs again,
  up to three attempts.

Every attempt's output is appended to the unit's log, ``runs/<group>/<setting>/seed-<k>.log``
(one run without seeds: ``runs/<group>/<setting>.log``).

Usage::

    python scripts/reproduce.py [TARGET ...] [--seeds 0,1,2] [--list] [--dry-run]

TARGET is a batch (``regime``, ``horizon``, ``headlines``, ``setups``, ``fedelmy``, ``lss``,
``lss-regime``, ``singles``, ``robustness``; default: ``regime horizon headlines``), a group
(``fedcda-seeds``) or one setting (``fedcda-seeds/dir0.1``).  ``--list`` prints every
experiment and how far each seed is (``archived``; ``running`` or, with no driver on it,
``partial``, with each strategy's rounds; ``to run``), ``--dry-run`` the commands a target
would run.  ``FEDSYS`` (default
``.venv/bin/fedsys``) and ``PY`` (default ``.venv/bin/python``) name the programs.  Run it at
``nice -n 10`` beside other work (not 19: a round then gets about 1 % of a busy CPU and can
pass the 600 s round-timeout); beside the test suite, at 0.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
DATA = Path("docs/results/data")

import asdata  # noqa: E402


@dataclass(frozen=True)
class Run:
    """One ``fedsys run`` of an experiment: a preset, its overrides, and the name its output
    takes (default: the experiment's setting)."""

    preset: str
    sets: tuple[str, ...] = ()
    name: str = ""


@dataclass(frozen=True)
class Experiment:
    """One setting of a results page and how to make it.

    Attributes
    ----------
    group, setting : str
        Its records are ``data/<group>-<setting>-s<k>-<strategy>.jsonl``, its runs
        ``runs/<group>/<setting>/seed-<k>/<strategy>/`` (``fedsys run --seeds k``).
    batch : str
        The named batch it runs in (``python scripts/reproduce.py <batch>``).
    runs : tuple of Run
        The commands of one seed, in order (a later one may branch from an earlier one's
        checkpoint: ``{seed}`` in a value is filled in by ``fedsys run --seeds``).
    seeds : tuple of int, optional
        The seeds; ``None``: one run of the preset's own seed, output ``runs/<name>/`` and
        records ``data/<name>.jsonl`` (the single-seed reproductions).
    archive : tuple of str
        The settings its records land in, when a run names its own (IMA's branches).
    pretrain : tuple of (preset, overrides, output)
        Pre-trained starts made once (``fedsys pretrain``) before its runs, shared by every
        seed and experiment that names the same output.
    after : tuple of tuple of str
        ``fedsys`` commands run once after its runs (a loss-landscape plane).
    """

    group: str
    setting: str
    batch: str
    runs: tuple[Run, ...]
    seeds: tuple[int, ...] | None = (0, 1, 2)
    archive: tuple[str, ...] = ()
    pretrain: tuple[tuple[str, tuple[str, ...], str], ...] = ()
    after: tuple[tuple[str, ...], ...] = field(default_factory=tuple)

    @property
    def key(self) -> str:
        return f"{self.group}/{self.setting}"

    def names(self) -> tuple[str, ...]:
        """The runs' output names (a setting under the group, or a run directory)."""
        return tuple(r.name or self.setting for r in self.runs)

    def command(self, run: Run, seed: int | None) -> list[str]:
        """The ``fedsys run`` arguments of ``run`` for ``seed``."""
        sets = [*run.sets, "resume=true"]
        if seed is None:
            sets.append(f"name={run.name or self.setting}")
            tail: list[str] = []
        else:
            sets += [f"output-dir=runs/{self.group}", f"name={run.name or self.setting}"]
            tail = ["--seeds", str(seed)]
        return ["run", run.preset, *[a for s in sets for a in ("--set", s)], *tail]


#: The experiment matrix, as data beside the presets (one entry per GROUP/SETTING).
MATRIX = ROOT / "configs" / "experiments" / "matrix.yaml"


def experiments(path: Path = MATRIX) -> list[Experiment]:
    """Every reproduction behind docs/results/, in the order a batch runs them: the
    entries of the matrix file ``path`` (``GROUP/SETTING`` -> the :class:`Experiment`'s
    other fields, kebab-case; :func:`asdata.load` says what is wrong in one)."""
    out = []
    for key, spec in asdata.read(path, dict).items():
        group, sep, setting = key.partition("/")
        if not (sep and group and setting):
            raise asdata.DataError(f"{path.name}: {key!r} is not GROUP/SETTING")
        out.append(asdata.load(Experiment, {**spec, "group": group, "setting": setting},
                               f"{path.name}: {key}"))
    return out


def branches(exp: Experiment) -> bool:
    """Whether a run of ``exp`` starts from another's checkpoint (IMA's branches)."""
    return any(s.startswith("branch-from=") for r in exp.runs for s in r.sets)


def record(exp: Experiment, run: Run, seed: int, label: str) -> Path:
    """Where the record of strategy ``label`` of ``run``, seed ``seed``, is archived."""
    return DATA / f"{exp.group}-{run.name or exp.setting}-s{seed}-{label}.jsonl"


def pending(exp: Experiment, seed: int | None) -> list[list[str]]:
    """The ``fedsys`` commands of one seed of ``exp`` still to run: one a strategy whose
    record is not archived (``--set strategy=ENTRY`` after the run's own overrides), or,
    for a run without seeds or an experiment with branches, its runs' commands whole."""
    if seed is None or branches(exp):
        return [exp.command(run, seed) for run in exp.runs]
    sys.path.insert(0, str(ROOT))
    from fedsys.config import parse_strategy
    from fedsys_launch import config_schema

    out = []
    for run in exp.runs:
        cfg = config_schema.load(Path(run.preset), [*run.sets])
        out += [exp.command(replace(run, sets=(*run.sets, f"strategy={v.spec}")), seed)
                for v in parse_strategy(cfg.strategy, cfg.schema)
                if not record(exp, run, seed, v.label).exists()]
    return out


def strategies_of(exp: Experiment) -> int:
    """How many strategy records one seed of ``exp`` archives (its presets' strategies)."""
    sys.path.insert(0, str(ROOT))
    from fedsys_launch import config_schema

    return sum(len(config_schema.load(Path(r.preset), [*r.sets]).variants()) for r in exp.runs)


def strategy_dirs(exp: Experiment, run: Run, seed: int | None) -> dict[str, tuple[Path, int]]:
    """Each strategy of ``run``'s directory for ``seed`` under ``runs/`` and its rounds, by label."""
    sys.path.insert(0, str(ROOT))
    from fedsys_launch import config_schema

    cfg = config_schema.load(Path(run.preset), [a for a in exp.command(run, seed)[3::2] if "=" in a])
    base = cfg.run_dir / ("" if seed is None else f"seed-{seed}")
    return {label: (base / label, v.num_server_rounds) for label, v in cfg.variants()}


def state(exp: Experiment, seed: int | None) -> str:
    """What ``--list`` says of one seed of ``exp``: ``archived``; ``running`` when a driver
    holds its lock, ``partial`` when it does not (the next driver resumes it), each with the
    rounds every strategy has recorded (``fedavg 30/30, fedcda 13/30``); ``to run``."""
    stem = Path("runs") / exp.group / (exp.setting if seed is None else f"{exp.setting}/seed-{seed}")
    if archived(exp, seed) >= strategies_of(exp):
        return "archived"
    done, started = [], False
    for run in exp.runs:
        for label, (where, rounds) in strategy_dirs(exp, run, seed).items():
            rows = where / "metrics.jsonl"
            if seed is not None and record(exp, run, seed, label).exists():
                rows = record(exp, run, seed, label)  # archived (its run may be elsewhere)
            last = last_round(rows)
            started |= last > 0
            done.append(f"{label} {last}/{rounds}")
    held = False
    if (lock := stem.with_suffix(".lock")).exists():
        with lock.open() as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                held = True
    if not (held or started):
        return "to run"
    return f"{'running' if held else 'partial'} ({', '.join(done)})"


def last_round(rows: Path) -> int:
    """The last round a ``metrics.jsonl`` records (0: none yet; a line being written when
    read is passed over)."""
    import json

    for line in reversed(rows.read_text().splitlines() if rows.exists() else []):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(line)["round"])
    return 0


def archived(exp: Experiment, seed: int | None) -> int:
    """How many of ``exp``'s strategy records of ``seed`` are in ``docs/results/data/``."""
    if seed is None:
        import json

        found = set()
        for name in exp.names():
            f = DATA / f"{name}.jsonl"
            if f.exists():
                found |= {(name, json.loads(line)["strategy"]) for line in f.read_text().splitlines()
                          if line.strip()}
        return len(found)
    return sum(len(list(DATA.glob(f"{exp.group}-{s}-s{seed}-*.jsonl")))
               for s in exp.archive or (exp.setting,))


class Driver:
    """Runs units, one at a time, with their locks, logs and archiving."""

    def __init__(self, fedsys: list[str], py: str, dry_run: bool) -> None:
        self.fedsys, self.py, self.dry_run = fedsys, py, dry_run
        self.failed = 0

    def call(self, args: list[str] | tuple[str, ...], log: Path | None) -> int:
        """Run ``fedsys ARGS``, its output to the terminal and appended to ``log``."""
        cmd = [*self.fedsys, *args]
        if self.dry_run:
            print("  " + shlex.join(cmd))
            return 0
        if log is None:
            return subprocess.run(cmd, check=False).returncode
        with log.open("a") as f:
            f.write(f"=== {time.strftime('%F %T', time.gmtime())} UTC: {shlex.join(cmd)}\n")
            f.flush()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                f.write(line)
            return proc.wait()

    def pretrain(self, preset: str, sets: tuple[str, ...], out: str) -> bool:
        """Make the pre-trained start ``out`` once (under a lock)."""
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path.with_name(path.name + ".lock"), wait=True):
            if path.exists():
                return True
            args = ["pretrain", preset, *[a for s in (*sets, f"pretrain.out={out}")
                                          for a in ("--set", s)]]
            return self.call(args, None) == 0 or self.dry_run

    def report(self, group: str) -> None:
        """Archive the finished runs of ``group`` and rewrite its page (one writer at a time)."""
        if self.dry_run:
            print(f"  {self.py} scripts/report.py {group}")
            return
        with locked(Path("runs/.report.lock"), wait=True):
            rc = subprocess.run([self.py, "scripts/report.py", group], stdout=subprocess.DEVNULL,
                                check=False).returncode
        if rc:
            print(f"reproduce: scripts/report.py {group} failed", file=sys.stderr)
            self.failed += 1

    def unit(self, exp: Experiment, seed: int | None, want: int) -> None:
        """One seed of ``exp``: skipped when archived or running elsewhere, else up to three
        attempts until its records are archived."""
        where = f"{exp.key}" + ("" if seed is None else f" seed {seed}")
        base = Path("runs") / exp.group / exp.setting
        stem = base.parent / f"{exp.setting}" if seed is None else base / f"seed-{seed}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        with locked(stem.with_suffix(".lock"), wait=False) as held:
            if not held:
                print(f"reproduce: {where}: running elsewhere, skipped")
                return
            if archived(exp, seed) >= want and not self.dry_run:
                print(f"reproduce: {where}: archived, skipped")
                return
            log = None if self.dry_run else stem.with_suffix(".log")
            for attempt in (1, 2, 3):
                print(f"reproduce: {where}, attempt {attempt} ({time.strftime('%H:%M', time.gmtime())} UTC)",
                      flush=True)
                ok = all(self.pretrain(*p) for p in exp.pretrain)
                todo = pending(exp, seed) if ok else []
                for args in todo:
                    ok = self.call(args, log) == 0
                    self.report(exp.group)  # a finished strategy's record, archived at once
                    if not ok:
                        print(f"reproduce: {where} failed (log: {log})", file=sys.stderr)
                        break
                for after in exp.after if ok else ():
                    self.call(after, log)
                if exp.after:
                    self.report(exp.group)
                if self.dry_run or archived(exp, seed) >= want:
                    if todo and seed is not None and not branches(exp):
                        self.gather(exp, seed, log)
                    return
            print(f"reproduce: {where} not archived", file=sys.stderr)
            self.failed += 1

    def gather(self, exp: Experiment, seed: int, log: Path | None) -> None:
        """Run each run of ``exp`` with several strategies whole once more for ``seed`` when
        all of them finished on this machine: each resumes at its last round, nothing trains,
        and the seed's directory gets its ``config.yaml``, ``results.md`` and plot with every
        strategy (each strategy's own command leaves them with that strategy alone).  A
        strategy finished elsewhere (only its record here) is not re-run for this: said."""
        for run in exp.runs:
            dirs = strategy_dirs(exp, run, seed)
            away = [label for label, (d, _) in dirs.items() if not (d / "model.pt").exists()]
            if len(dirs) < 2:
                continue
            if away and not self.dry_run:
                print(f"reproduce: {exp.key} seed {seed}: {', '.join(away)} finished on another "
                      f"machine (records in {DATA}); the seed's results.md lists the others only")
                continue
            if self.call(exp.command(run, seed), log):
                print(f"reproduce: {exp.key} seed {seed}: gathering its strategies in one "
                      f"results.md failed (log: {log}); their records are archived", file=sys.stderr)


@contextlib.contextmanager
def locked(path: Path, wait: bool) -> Iterator[bool]:
    """An ``flock`` on ``path`` for a ``with`` block; ``wait=False`` gives up at once (the
    block then sees ``False``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def select(targets: list[str], table: list[Experiment]) -> Iterator[Experiment]:
    """The experiments named by ``targets`` (batches, groups or group/setting), in order."""
    for t in targets:
        hit = [e for e in table if t in (e.batch, e.group, e.key)]
        if not hit:
            known = sorted({e.batch for e in table} | {e.group for e in table})
            raise SystemExit(f"reproduce: unknown target {t!r}; one of {', '.join(known)}, "
                             f"or GROUP/SETTING (--list shows them)")
        yield from hit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="*", default=["regime", "horizon", "headlines"])
    ap.add_argument("--seeds", help="only these seeds (e.g. 0,1)")
    ap.add_argument("--list", action="store_true",
                    help="print every experiment, its seeds and how far each is, and stop")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    try:
        table = experiments()
    except asdata.DataError as exc:  # the matrix written wrong: one line naming the entry
        print(f"reproduce: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for e in table:
            seeds = "one run" if e.seeds is None else "seeds " + ",".join(map(str, e.seeds))
            states = [(s, state(e, s)) for s in (e.seeds or (None,))]
            if len({st for _, st in states}) == 1:
                now = states[0][1]
            else:
                now = "; ".join(f"{s}: {st}" for s, st in states)
            print(f"{e.key:40} {e.batch:11} {seeds:14} {now}", flush=True)
        return 0
    only = {int(s) for s in args.seeds.split(",")} if args.seeds else None
    driver = Driver(shlex.split(os.environ.get("FEDSYS", ".venv/bin/fedsys")),
                    os.environ.get("PY", ".venv/bin/python"), args.dry_run)
    for exp in select(args.targets, table):
        want = strategies_of(exp)
        for seed in exp.seeds if exp.seeds is not None else (None,):
            if only is None or seed is None or seed in only:
                driver.unit(exp, seed, want)
    return 1 if driver.failed else 0


if __name__ == "__main__":
    sys.exit(main())
