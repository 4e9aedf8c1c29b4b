"""House style of the code generators in polyonnx/emit/ (issue 34): every function is short
and says what it needs in its signature.

- A function spans at most `MAX_LINES` lines, counted from its `def` line (decorators not
  included) to its last line, minus the lines of its docstring. A nested function's lines
  count in the function around it too.
- A function takes at most `MAX_POSITIONAL` positional parameters (positional-only plus
  ordinary ones, `self` and `cls` not counted); keyword-only parameters are not limited.

`ALLOWED` names the functions that still break a rule: each is still to do, and the set only
shrinks. A name listed there that no longer breaks its rule fails the test, so the list
stays true.
"""

from __future__ import annotations

import ast
from pathlib import Path

import polyonnx.emit

EMIT = Path(polyonnx.emit.__file__).parent
MAX_LINES = 60
MAX_POSITIONAL = 6

# (file, qualified name, rule) still to do; "lines" or "positional".
ALLOWED: frozenset[tuple[str, str, str]] = frozenset()


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first.end_lineno - first.lineno + 1
    return 0


def _functions(tree: ast.Module):
    """(qualified name, node) of every function, methods and nested ones included."""

    def walk(node: ast.AST, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _violations() -> set[tuple[str, str, str]]:
    found = set()
    for path in sorted(EMIT.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for name, node in _functions(tree):
            lines = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
            if lines > MAX_LINES:
                found.add((path.name, name, "lines"))
            positional = [a.arg for a in node.args.posonlyargs + node.args.args]
            positional = [a for a in positional if a not in ("self", "cls")]
            if len(positional) > MAX_POSITIONAL:
                found.add((path.name, name, "positional"))
    return found


def test_functions_are_short_with_few_positional_parameters():
    new = sorted(_violations() - ALLOWED)
    assert not new, f"functions over {MAX_LINES} lines or {MAX_POSITIONAL} positional: {new}"


def test_allowed_exceptions_are_still_needed():
    stale = sorted(ALLOWED - _violations())
    assert not stale, f"these now keep the rules: remove them from ALLOWED: {stale}"
