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


def main() -> None:
    """Replace every ``tool.flwr.app.config`` table with the generated ones."""
    toml = subprocess.run([sys.executable, "-m", "launch", "keys", "--toml"], capture_output=True,
                          text=True, check=True, cwd=ROOT).stdout
    p = ROOT / "pyproject.toml"
    s = p.read_text()
    start = s.index("[tool.flwr.app.config]")
    heads = [m for m in re.finditer(r"^\[([^\]]+)\]", s, re.M) if m.start() > start]
    end = next((m.start() for m in heads if not m.group(1).startswith("tool.flwr.app.config")),
               len(s))
    p.write_text(s[:start] + toml.rstrip("\n") + "\n" + ("\n" if end < len(s) else "") + s[end:])
    print(f"updated {p}")


if __name__ == "__main__":
    main()
