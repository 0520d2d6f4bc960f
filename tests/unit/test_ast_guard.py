"""The suite's guard against CPython's concurrent ``ast.parse`` bug (gh-106905):
``tests/ast_guard/sitecustomize.py``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import threading

from conftest import AST_GUARD

SOURCE = (AST_GUARD / "sitecustomize.py").read_text()
AFFECTED = (3, 11) <= sys.version_info[:3] < (3, 11, 8) or (3, 12) <= sys.version_info[:3] < (3, 12, 2)


def test_parse_is_serialized_here_exactly_where_the_interpreter_is_affected() -> None:
    assert (getattr(ast.parse, "__wrapped__", None) is not None) == AFFECTED
    # and it still parses: the same tree, from threads at once
    expected = ast.dump(compile(SOURCE, "s.py", "exec", ast.PyCF_ONLY_AST))
    dumps: list[str] = []
    threads = [threading.Thread(target=lambda: dumps.extend(
        ast.dump(ast.parse(SOURCE)) for _ in range(20))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert dumps == [expected] * 60


def test_processes_given_the_guard_directory_are_guarded_at_start_up() -> None:
    env = {**os.environ, "PYTHONPATH": str(AST_GUARD)}
    code = "import ast; print(getattr(ast.parse, '__wrapped__', None) is not None)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == str(AFFECTED)
