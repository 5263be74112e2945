"""Hot-path discipline: no device syncs inside per-env or per-batch loops.

An AST lint over the trainer modules: any call to ``.item()``, ``.cpu()``, ``.tolist()``
or ``.numpy()`` lexically inside a ``for``/``while`` loop or a comprehension (what runs
per item, not the expression a loop iterates over, which runs once) fails the test,
naming file and line. Syncs belong after the loop, once per pass. (The runtime guard is
``tests/training/test_sync_guard.py``; this catches paths a short run does not reach.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "esper"
HOT_MODULES = [
    "training/loop/trainer.py",
    "training/passes/batch_ops.py",
    "training/passes/host_batching.py",
    "training/passes/slot_groups.py",
    "training/passes/host_store.py",
    "training/learning/ppo.py",
    "training/envs/action_execution.py",
    "training/envs/env_factory.py",
    "training/envs/env_state.py",
    "training/learning/learner.py",
    "training/loop/recorder.py",
    "training/envs/host_envs.py",
    "training/envs/env_results.py",
    "training/envs/step_rewards.py",
    "policy/features.py",
    "policy/masks.py",
    "policy/mask_rules.py",
    "policy/network.py",
    "policy/heuristic.py",
    "policy/eager.py",
    "policy/random_valid.py",
    "policy/static.py",
]
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


def sync_calls_in_loops(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_loop: bool) -> None:
        if (
            in_loop
            and isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SYNC_METHODS
        ):
            found.append((node.lineno, node.func.attr))
        inner = in_loop or isinstance(node, LOOPS)
        # What a loop iterates over is evaluated once, before it: a for's ``iter``, and a
        # comprehension's first ``iter`` (the later ones run per item of the first).
        once: ast.AST | None = None
        if isinstance(node, ast.For | ast.AsyncFor):
            once = node.iter
        elif isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            first = node.generators[0]
            visit(first.iter, in_loop)
            for child in ast.iter_child_nodes(first):
                if child is not first.iter:
                    visit(child, inner)
            once = first  # visited above
        # A nested function body defined inside a loop is still executed per iteration.
        for child in ast.iter_child_nodes(node):
            if child is once and isinstance(child, ast.comprehension):
                continue
            visit(child, in_loop if child is once else inner)

    visit(tree, False)
    return found


@pytest.mark.parametrize("module", HOT_MODULES)
def test_no_sync_inside_loops(module: str) -> None:
    path = ROOT / module
    offenders = sync_calls_in_loops(path.read_text())
    assert not offenders, f"{module}: device sync inside a loop at " + ", ".join(
        f"line {ln} (.{name}())" for ln, name in offenders
    )


def test_lint_catches_a_sync_in_a_loop() -> None:
    bad = "for env in envs:\n    loss = env.loss.item()\n"
    assert sync_calls_in_loops(bad) == [(2, "item")]
    comp = "xs = [t.cpu() for t in ts]\n"
    assert sync_calls_in_loops(comp) == [(1, "cpu")]
    ok = "host = torch.cat(parts).cpu().tolist()\nfor v in host:\n    total += v\n"
    assert sync_calls_in_loops(ok) == []
