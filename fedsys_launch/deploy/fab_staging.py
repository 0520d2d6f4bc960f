"""The directory ``flwr run`` builds the FAB from: the files ``fab-include`` names, copied
once per content (:func:`staged_app`)."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import tomllib
from pathlib import Path


def _fab_globs(pattern: str) -> str | None:
    """A ``fab-include`` pattern (gitignore style) as a :meth:`Path.glob` pattern, or
    ``None`` where the two could disagree (a negation, a character class)."""
    if pattern.startswith("!") or "[" in pattern or "\\" in pattern:
        return None
    if pattern.endswith("/"):
        pattern += "**/*"
    if pattern.startswith("/"):
        return pattern[1:]
    return pattern if "/" in pattern.rstrip("/") else f"**/{pattern}"


def staged_app(app_dir: Path, into: Path) -> Path:
    """The directory ``flwr run`` builds the FAB from: ``app_dir`` itself, or, where its
    ``pyproject.toml`` lists ``fab-include`` patterns under ``[tool.flwr.app]`` (fedsys's
    does), a copy of ``pyproject.toml``, ``.gitignore`` and the files the patterns match,
    in ``into/app-<digest of the copy>`` (made once per content, never changed after).

    Flower's ``flwr run`` walks every file under the directory it is given before it
    filters, a checkout's virtual environments and ``runs/`` included (docs/deployment.md
    gives the cost).  The copy holds the files the FAB is built from, so the FAB and its
    hash are the same (``tests/unit/test_deploy_cli.py``).
    """
    project = app_dir / "pyproject.toml"
    try:
        patterns = tomllib.loads(project.read_text())["tool"]["flwr"]["app"]["fab-include"]
        globs = [_fab_globs(str(p)) for p in patterns]
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return app_dir
    if not globs or None in globs:
        return app_dir
    files = sorted({p for g in globs if g is not None for p in app_dir.glob(g)
                    if p.is_file() and not p.is_symlink()})
    files = [project, *([app_dir / ".gitignore"] if (app_dir / ".gitignore").is_file() else []),
             *(f for f in files if f != project)]
    content = {f.relative_to(app_dir).as_posix(): f.read_bytes() for f in files}
    digest = hashlib.sha256()
    for rel, data in content.items():
        digest.update(rel.encode() + b"\0" + data + b"\0")
    target = into / f"app-{digest.hexdigest()[:16]}"
    if target.is_dir():
        return target
    tmp = into / f".app-{os.getpid()}-{time.time_ns()}"
    for rel, data in content.items():
        dst = tmp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
    try:
        tmp.rename(target)
    except OSError:  # another submission made the same copy first
        shutil.rmtree(tmp, ignore_errors=True)
    return target
