"""The whole model as one LLVM module: a function per kernel and one entry,
``void polyonnx_main(ptr %slots)``, that calls the kernels in order with pointers
computed from the slot array and arena offsets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llvmlite import ir

from polyonnx.emit.codegen import emit_kernel
from polyonnx.emit.llvmtypes import I64, PTR
from polyonnx.emit.target import Target
from polyonnx.krnl.canon import structural_key
from polyonnx.krnl.ir import Buffer
from polyonnx.schedule.tree import KernelSchedule

ENTRY = "polyonnx_main"


def kernel_symbol(index: int, name: str) -> str:
    clean = "".join(c if c.isalnum() else "_" for c in name)[:48]
    return f"k{index}_{clean}"


def emit_module(
    schedules: Sequence[KernelSchedule],
    buffers: Mapping[str, Buffer],
    places: Mapping[str, tuple[int, int]],
    target: Target,
) -> tuple[ir.Module, list[str]]:
    """``places`` maps each buffer to (slot index, byte offset). Returns the module and,
    per kernel, the symbol of the function it calls: structurally identical kernels (same
    statements, shapes, dtypes and schedule; other tensors) share one function."""
    module = ir.Module("polyonnx")
    module.triple = target.triple
    width = target.lanes(4)
    shared: dict[str, ir.Function] = {}
    kernels = []
    for i, s in enumerate(schedules):
        key = structural_key(s.kernel, buffers, s.tree)
        if key not in shared:
            shared[key] = emit_kernel(module, kernel_symbol(i, s.kernel.name), s, buffers, width)
        kernels.append(shared[key])
    entry = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), ENTRY)
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    slots = entry.args[0]
    pointers: dict[tuple[int, int], ir.Value] = {}
    for fn, schedule in zip(kernels, schedules, strict=True):
        args = []
        for name in schedule.kernel.buffers():
            place = places[name]
            if place not in pointers:
                slot_ptr = b.gep(
                    slots, [ir.Constant(I64, place[0])], inbounds=True, source_etype=PTR
                )
                base = b.load(slot_ptr, typ=PTR)
                pointers[place] = b.gep(
                    base, [ir.Constant(I64, place[1])], inbounds=True, source_etype=ir.IntType(8)
                )
            args.append(pointers[place])
        b.call(fn, args)
    b.ret_void()
    return module, [fn.name for fn in kernels]
