"""Recording results into the docs: a benchmark's table into its section of
``docs/performance.md`` (:func:`record_section`, :func:`write_subsection`: replaced where it
stands, stamped with the command and the machine), and a reproduction's per-round records
kept beside its results page (:func:`kept_records`).  Docs tooling, kept out of the core."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

from fedsys.metrics import read_jsonl, write_jsonl


def replace_section(text: str, head: str, body: str) -> str:
    """Markdown ``text`` with the section titled ``head`` set to ``body``.

    The section runs from its heading line to the next heading of the same or a higher
    level; it is replaced where it stands (benchmarks record their tables into
    ``docs/performance.md`` this way, so the document keeps its order), or appended at
    the end when ``text`` has no such heading.
    """
    level = len(head) - len(head.lstrip("#"))
    lines = text.rstrip("\n").split("\n")
    new = [head, "", *body.rstrip("\n").split("\n")]
    if head not in lines:
        return "\n".join([*lines, "", *new]) + "\n"
    start = lines.index(head)
    end = len(lines)
    for i in range(start + 1, len(lines)):
        hashes = len(lines[i]) - len(lines[i].lstrip("#"))
        if 0 < hashes <= level and lines[i][hashes:hashes + 1] == " ":
            end = i
            break
    tail = ["", *lines[end:]] if end < len(lines) else []
    return "\n".join([*lines[:start], *new, *tail]) + "\n"


def replace_subsection(text: str, parent: str, head: str, body: str) -> str:
    """:func:`replace_section` for a subsection ``head`` of the section ``parent``.

    A missing ``parent`` is appended at the end of the document; a missing ``head``
    is appended at the end of ``parent``'s section (later records then replace it
    where it stands, so a document keeps the order its editor gave it).
    """
    lines = text.rstrip("\n").split("\n")
    if head in lines:
        return replace_section(text, head, body)
    if parent not in lines:
        return replace_section(replace_section(text, parent, ""), head, body)
    level = len(parent) - len(parent.lstrip("#"))
    end = len(lines)
    for i in range(lines.index(parent) + 1, len(lines)):
        hashes = len(lines[i]) - len(lines[i].lstrip("#"))
        if 0 < hashes <= level and lines[i][hashes:hashes + 1] == " ":
            end = i
            break
    before = lines[:end]
    while before and before[-1] == "":
        before.pop()
    new = [*before, "", head, "", *body.rstrip("\n").split("\n")]
    rest = ["", *lines[end:]] if end < len(lines) else []
    return "\n".join([*new, *rest]) + "\n"


def kept_records(runs: Path, data: Path, run: str, strategy: str) -> list[dict[str, Any]]:
    """Per-round records of ``strategy`` in run ``run``, kept beside the results.

    Reads ``runs/<run>/<strategy>/metrics.jsonl`` and copies it into ``data/<run>.jsonl``
    (one file per run, all its strategies); when the run directory is gone (``runs/``
    is not kept between machines) the copy is read instead.  The reproduction report
    scripts use this so their tables can be rebuilt from ``docs/results/data``.
    """
    recs = read_jsonl(runs / run / strategy / "metrics.jsonl")
    saved = data / f"{run}.jsonl"
    if recs:
        data.mkdir(parents=True, exist_ok=True)
        others = [r for r in read_jsonl(saved) if r.get("strategy") != strategy]
        write_jsonl(saved, others + [{**r, "strategy": strategy} for r in recs])
        return recs
    return [r for r in read_jsonl(saved) if r.get("strategy") == strategy]


def stamp(command: str, *details: str) -> str:
    """The lines a recorded benchmark result starts with: the command that made it and
    the machine (architecture, cores, any ``details`` such as the torch version, date)."""
    machine = ", ".join([platform.machine(), f"{os.cpu_count()} cores", *details,
                         time.strftime("%Y-%m-%d")])
    return f"Command: `{command}`  \nMachine: {machine}\n\n"


def write_subsection(doc: Path, parent: str, head: str, body: str) -> None:
    """Set (in place) the subsection ``head`` of the section ``parent`` of the Markdown
    file ``doc`` to ``body`` (:func:`replace_subsection`) and say where it went."""
    doc.write_text(replace_subsection(doc.read_text(), parent, head, body))
    print(f"recorded in {doc}")


def record_section(doc: Path, head: str, command: str, text: str, *details: str) -> None:
    """Set the section ``head`` of the Markdown file ``doc`` to a benchmark's result.

    The section starts with :func:`stamp`, then ``text``; it is replaced where it stands
    (:func:`replace_section`), or added at the end.  The benchmarks record their tables
    into ``docs/performance.md`` this way.
    """
    doc.write_text(replace_section(doc.read_text(), head, stamp(command, *details) + text))


__all__ = ["kept_records", "record_section", "replace_section", "replace_subsection", "stamp", "write_subsection"]
