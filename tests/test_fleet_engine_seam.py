"""The simulator reaches the engine through its public methods only: no `slobench/fleet/` module reads or
writes an underscored member it does not define itself (an engine's, a scheduler's, a block manager's)."""

from __future__ import annotations

import ast
from pathlib import Path

import slobench.fleet

FLEET = Path(slobench.fleet.__file__).parent


def _foreign_privates(source: str) -> list[str]:
    tree = ast.parse(source)
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)  # a dataclass's fields
    return [f"line {node.lineno}: .{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and node.attr not in own]


def test_the_rule_finds_a_foreign_private() -> None:
    assert _foreign_privates("def f(e):\n    e.scheduler._by_id.clear()\n") == ["line 2: ._by_id"]
    assert _foreign_privates("class B(A):\n    def g(self):\n        return super()._evict(1)\n") == ["line 3: ._evict"]
    assert _foreign_privates("class C:\n    def _h(self):\n        self._n = 1\n        return self._h()\n") == []


def test_no_fleet_module_touches_a_private_member_of_another() -> None:
    found = {p.name: bad for p in sorted(FLEET.glob("*.py")) if (bad := _foreign_privates(p.read_text()))}
    assert found == {}
