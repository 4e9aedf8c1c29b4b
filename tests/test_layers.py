"""The packages' layers point one way (docs/architecture.md, "Layers"): each package
imports only the ones below it, and only emit/ and the target description use LLVM.
Function-level imports count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "polyonnx"
FORBIDDEN = {
    "frontend": {"krnl", "schedule", "emit", "runtime", "tune", "bench", "llvmlite"},
    "krnl": {"schedule", "emit", "runtime", "tune", "bench", "llvmlite"},
    "schedule": {"emit", "runtime", "tune", "bench", "llvmlite"},
    "emit": {"runtime", "tune", "bench"},
    "runtime": {"tune", "bench"},
    "tune": {"bench"},
}
"""Per package, what it may not import: polyonnx's packages by name, and llvmlite."""


def _imports(path: Path) -> set[str]:
    """The first component under polyonnx (or the top-level module) of every import."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found.add(parts[1] if parts[0] == "polyonnx" and len(parts) > 1 else parts[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_the_layers_below(package):
    broken = {
        str(path.relative_to(PACKAGE.parent)): sorted(_imports(path) & FORBIDDEN[package])
        for path in sorted((PACKAGE / package).rglob("*.py"))
    }
    assert not {p: names for p, names in broken.items() if names}


def test_primitives_do_not_import_the_heuristics_that_choose_them():
    """schedule/primitives/ is mechanism (split, reorder, pack, fuse, marks);
    schedule/heuristics/ is the policy that picks them."""
    broken = {}
    for path in sorted((PACKAGE / "schedule" / "primitives").glob("*.py")):
        tree = ast.parse(path.read_text())
        modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        bad = [m for m in modules if m.startswith("polyonnx.schedule.heuristics")]
        if bad:
            broken[path.name] = bad
    assert not broken


def test_the_rules_see_imports_inside_functions(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from polyonnx.emit.jit import JitModule\n    import llvmlite\n")
    assert _imports(probe) == {"emit", "llvmlite"}
