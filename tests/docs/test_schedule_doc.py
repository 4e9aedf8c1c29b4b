"""docs/schedule.md runs as written.

The page's ```python blocks run in order in one namespace, from the repository root. A
```text block right after a python block is what that block prints: its stdout, then, if
the block raises, the exception as Python's traceback ends (``ScheduleError: message``).
A ```console block ``$ polyonnx ARGS`` followed by text runs the command line and compares
what it prints. Lines are compared without trailing spaces. Other blocks are not run.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import shlex
from dataclasses import dataclass

import numpy as np
import pytest

import polyonnx as po
from polyonnx import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "schedule.md"
REFERENCE = "# Reference"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int
    reference: bool
    """In the reference part of the page (after the tutorial)."""


@dataclass(frozen=True)
class Outcome:
    block: Block
    expected: str | None
    got: str
    raised: BaseException | None


def blocks(text: str) -> list[Block]:
    split = text.find(f"\n{REFERENCE}\n")
    return [
        Block(m[1], m[2], text.count("\n", 0, m.start()) + 1, 0 <= split < m.start())
        for m in FENCE.finditer(text)
    ]


def normalise(text: str) -> str:
    """Lines without trailing blanks; the ukernel mark's register tile (the page shows
    AVX-512's 8 x 32, AVX2 machines print 6 x 16 and other cache blocks) as ``ukernel_*``;
    tests/schedule/test_ukernel.py checks the tile per target."""
    text = re.sub(r"#pragma ukernel_\w+", "#pragma ukernel_*", text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def run_python(block: Block, namespace: dict) -> tuple[str, BaseException | None]:
    out = io.StringIO()
    raised = None
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(block.code, f"{DOC.name}:{block.line}", "exec"), namespace)
        except Exception as exc:
            raised = exc
    got = out.getvalue()
    if raised is not None:
        got += f"{type(raised).__name__}: {raised}\n"
    return got, raised


def run_console(block: Block) -> tuple[str, str]:
    command, _, expected = block.code.partition("\n")
    assert command.startswith("$ polyonnx "), f"line {block.line}: not a polyonnx command"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(shlex.split(command)[2:])
    assert status == 0, f"line {block.line}: {command} exited with {status}"
    return out.getvalue(), expected


def run_doc(text: str) -> tuple[list[Outcome], dict, dict]:
    """Every checked block's outcome, the namespace at the end of the tutorial, and at
    the end of the page."""
    found = blocks(text)
    namespace: dict = {"__name__": "schedule_doc"}
    tutorial: dict | None = None
    outcomes = []
    for index, block in enumerate(found):
        if block.reference and tutorial is None:
            tutorial = dict(namespace)
        after = found[index + 1] if index + 1 < len(found) else None
        expected = after.code if after is not None and after.lang == "text" else None
        if block.lang == "python":
            got, raised = run_python(block, namespace)
            outcomes.append(Outcome(block, expected, got, raised))
        elif block.lang == "console":
            got, expected = run_console(block)
            outcomes.append(Outcome(block, expected, got, None))
    return outcomes, namespace if tutorial is None else tutorial, namespace


@pytest.fixture(scope="module")
def doc():
    with contextlib.chdir(ROOT):
        return run_doc(DOC.read_text())


def test_blocks_print_what_the_page_shows(doc):
    outcomes, _, _ = doc
    wrong = []
    for o in outcomes:
        if o.raised is not None and o.expected is None:
            wrong.append(f"line {o.block.line} raised {type(o.raised).__name__}: {o.raised}")
        elif o.expected is not None and normalise(o.got) != normalise(o.expected):
            wrong.append(f"line {o.block.line} printed:\n{o.got}\nthe page shows:\n{o.expected}")
    assert not wrong, "\n\n".join(wrong)


def test_every_schedule_error_example_raises_it(doc):
    outcomes, _, _ = doc
    examples = [o for o in outcomes if o.expected and o.expected.startswith("ScheduleError: ")]
    assert len(examples) >= 8
    for o in examples:
        assert isinstance(o.raised, po.ScheduleError), f"line {o.block.line} did not raise"
    raising = [o for o in outcomes if o.raised is not None]
    assert all(isinstance(o.raised, po.ScheduleError) for o in raising)


def test_the_page_covers_every_primitive(doc):
    outcomes, _, _ = doc
    code = "\n".join(o.block.code for o in outcomes)
    for primitive in ("split", "tile", "reorder", "vectorize", "unroll", "parallel", "pack"):
        assert f".{primitive}(" in code
    assert ".compute_at(" in code and ".apply(" in code and ".trace" in code


@pytest.mark.parametrize("threads", [1, 2])
def test_tutorial_schedule_computes_what_the_default_does(doc, threads):
    _, tutorial, _ = doc
    trace = tutorial["prog"].trace
    assert [step["primitive"] for step in trace][-1] == "parallel"
    model = ROOT / "examples" / "mm_bias_relu.onnx"
    prog = po.load(model)
    prog.apply(trace)
    x = np.random.default_rng(7).standard_normal((256, 512)).astype(np.float32)
    (got,) = po.InferenceSession(prog, threads=threads).run(None, {"x": x})
    (want,) = po.InferenceSession(model).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
