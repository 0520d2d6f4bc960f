"""Rewrite pyproject.toml's ``[tool.flwr.app.config]`` tables from ``fedsys keys --toml``
(the schema of the registered methods); ``tests/unit/test_config.py`` keeps them equal.

Usage::

    python scripts/sync_pyproject_config.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def synced(text: str, toml: str) -> str:
    """``text`` (pyproject.toml) with every ``tool.flwr.app.config`` table replaced by the
    tables of ``toml`` (``fedsys keys --toml``)."""
    start = text.index("[tool.flwr.app.config]")
    heads = [m for m in re.finditer(r"^\[([^\]]+)\]", text, re.M) if m.start() > start]
    end = next((m.start() for m in heads if not m.group(1).startswith("tool.flwr.app.config")),
               len(text))
    return text[:start] + toml.rstrip("\n") + "\n" + ("\n" if end < len(text) else "") + text[end:]


def main() -> None:
    """Replace every ``tool.flwr.app.config`` table with the generated ones."""
    toml = subprocess.run([sys.executable, "-m", "fedsys_launch", "keys", "--toml"],
                          capture_output=True, text=True, check=True, cwd=ROOT).stdout
    p = ROOT / "pyproject.toml"
    new = synced(p.read_text(), toml)
    if new == p.read_text():
        print(f"{p} already holds the tables")
        return
    p.write_text(new)
    print(f"updated {p}")


if __name__ == "__main__":
    main()
