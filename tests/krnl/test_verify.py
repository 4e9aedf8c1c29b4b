"""Every affine access is proved to stay inside its buffer before code generation."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from polyonnx.errors import LoweringError
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Buffer, Kernel, Program, Statement
from polyonnx.krnl.verify import check_bounds


def _program(read_index: list[str], domain_shape=(4, 5)) -> Program:
    dims = ["i", "j"]
    stmt = Statement(
        "S0",
        kb.box("S0", dims, domain_shape),
        kb.access("y", "S0", dims, dims),
        kb.load(kb.access("x", "S0", dims, read_index), "float32"),
    )
    buffers = {"x": Buffer("x", (4, 5), "float32"), "y": Buffer("y", domain_shape, "float32")}
    return Program((Kernel("k", "Test", (stmt,)),), MappingProxyType(buffers), ("x",), ("y",))


def test_in_bounds_accesses_pass():
    check_bounds(_program(["i", "j"]))
    check_bounds(_program(["3 - i", "0"]))


@pytest.mark.parametrize("index", [["i + 1", "j"], ["i", "j - 1"], ["i", "2*j"]])
def test_out_of_bounds_reads_are_refused_with_a_witness(index):
    with pytest.raises(
        LoweringError, match=r"kernel 'k': statement S0 reads 'x' \(shape \[4, 5\]\) at \["
    ) as err:
        check_bounds(_program(index))
    assert "internal error" in str(err.value)


def test_out_of_bounds_writes_are_refused():
    program = _program(["i", "j"])
    bad = Program(
        program.kernels,
        MappingProxyType({**program.buffers, "y": Buffer("y", (4, 4), "float32")}),
        program.inputs,
        program.outputs,
    )
    with pytest.raises(LoweringError, match="writes 'y'"):
        check_bounds(bad)
