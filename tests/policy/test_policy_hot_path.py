"""The per-step policy modules never force a device sync inside a loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

POLICY = Path(__file__).resolve().parents[2] / "src" / "esper" / "policy"
SYNC_METHODS = {"item", "cpu", "tolist", "numpy"}
LOOPS = (
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def syncs_in_loops(source: str) -> list[int]:
    found: list[int] = []

    def visit(node: ast.AST, in_loop: bool) -> None:
        if (
            in_loop
            and isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SYNC_METHODS
        ):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, in_loop or isinstance(node, LOOPS))

    visit(ast.parse(source), False)
    return found


@pytest.mark.parametrize("module", ["features.py", "masks.py", "network.py", "heuristic.py"])
def test_no_sync_calls_inside_loops(module: str) -> None:
    assert syncs_in_loops((POLICY / module).read_text()) == []


def test_features_and_masks_never_call_item_or_tolist() -> None:
    for module in ("features.py", "masks.py"):
        text = (POLICY / module).read_text()
        assert ".item(" not in text and ".tolist(" not in text, module


def test_the_check_detects_a_sync_in_a_loop() -> None:
    assert syncs_in_loops("for e in envs:\n    v = e.loss.item()\n") == [2]
    assert syncs_in_loops("xs = [t.cpu() for t in ts]\n") == [1]
    assert syncs_in_loops("host = torch.cat(ts).cpu()\nfor v in host:\n    s += v\n") == []
