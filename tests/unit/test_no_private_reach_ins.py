"""No module of services/gregor reaches into another module's private names (docs/architecture.md, Layering).

A private name is one with a single leading underscore. Reading `obj._x` is allowed only when the module
itself defines `_x` (its own classes' attributes, set as `self._x` or defined as `def _x`); importing `_x`
from another module is never allowed. What one module needs of another is a public method or a declared
interface (a Protocol), so a change inside a module cannot break another behind its back.
"""

from __future__ import annotations

import ast
import pathlib

SERVICES = pathlib.Path(__file__).resolve().parents[2] / "services" / "gregor"


def _own_private_names(tree: ast.AST) -> set[str]:
    """The private names this module defines: `self._x` / `cls._x` attributes, `_x` functions, classes, globals."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls") and node.attr.startswith("_")):
            own.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name.startswith("_"):
            own.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
        elif isinstance(node, ast.Assign):
            own.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return own


def violations(source: str, where: str = "x.py") -> list[str]:
    tree = ast.parse(source)
    own = _own_private_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr not in own:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{where}:{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_the_check_finds_reach_ins_and_allows_a_module_its_own_privates() -> None:
    assert violations("def f(rm):\n    return rm._read(1)\n")
    assert violations("from gregor.cli.groups import _table\n")
    assert violations("class G:\n    def f(self):\n        return self.consumer._subscriptions\n")
    own = "class Op:\n    def __init__(self):\n        self._timer = None\n\ndef cancel(op):\n    op._timer = None\n"
    assert not violations(own)
    assert not violations("class A:\n    def f(self, other):\n        return self.__dict__, other.__class__\n")


def test_no_module_reaches_into_another_modules_private_names() -> None:
    files = sorted(p for p in SERVICES.rglob("*.py") if "rpc/v1" not in p.as_posix())
    assert len(files) > 100
    found: list[str] = []
    for path in files:
        found += violations(path.read_text(), path.relative_to(SERVICES).as_posix())
    assert not found, "private names used across modules:\n" + "\n".join(found)
