"""Samples of a batch run side by side on the pool's threads, each group on its own slots.

A model run in blocks (runtime/blocks.py) runs one sample per call. Where a sample is too
small to split across threads (a 32x32 ResNet), its parallel loops gain nothing; groups
of samples run at once do (docs/measurements.md, 'Samples side by side').
``polyonnx_samples`` is a pool body (emit/pool.py): chunk ``t`` of ``groups`` runs samples
``[t*count/groups, (t+1)*count/groups)`` on slot array ``t``, each sample's ports moved
along by their steps. The samples' own parallel loops find the pool busy, so run serially.
A group stops at its first failed check (its error record is no longer zero).
"""

from __future__ import annotations

from llvmlite import ir

from polyonnx.emit.irhelp import loop
from polyonnx.emit.llvmtypes import I64, PTR
from polyonnx.emit.pool import BODY_TYPE

SAMPLES = "polyonnx_samples"
FIELDS = (
    "entry",
    "slots",
    "slot_count",
    "count",
    "groups",
    "ports",
    "indices",
    "bases",
    "steps",
    "error_slot",
)
"""The context's i64 fields, in order: the entry's address, the ``groups`` slot arrays
(one after another), slots per array, samples, groups, ports moved per sample, then three
arrays of ``ports`` values (each port's slot, its first sample's address, its step in
bytes) and the slot of the error record's pointer."""
ENTRY_TYPE = ir.FunctionType(ir.VoidType(), [PTR])


def define_samples(module: ir.Module) -> ir.Function:
    """Define SAMPLES in ``module``."""
    fn = ir.Function(module, BODY_TYPE, SAMPLES)
    ctx, lo, last = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    field = {name: _load(b, ctx, i) for i, name in enumerate(FIELDS)}
    entry = b.inttoptr(field["entry"], ENTRY_TYPE.as_pointer())
    slots_base = b.inttoptr(field["slots"], PTR)
    arrays = [b.inttoptr(field[name], PTR) for name in ("indices", "bases", "steps")]
    count, groups = field["count"], field["groups"]
    with loop(b, lo, b.add(last, ir.Constant(I64, 1)), 1, "group") as t:
        slots = b.gep(slots_base, [b.mul(t, field["slot_count"])], source_etype=I64)
        first = b.sdiv(b.mul(t, count), groups)
        stop = b.sdiv(b.mul(b.add(t, ir.Constant(I64, 1)), count), groups)
        with loop(b, first, stop, 1, "sample") as n:
            with loop(b, ir.Constant(I64, 0), field["ports"], 1, "port") as p:
                index, base, step = (_load(b, array, p) for array in arrays)
                at = b.gep(slots, [index], source_etype=I64)
                b.store(b.add(base, b.mul(n, step)), at)
            record = b.inttoptr(_load(b, slots, field["error_slot"]), PTR)
            clean = b.icmp_signed("==", b.load(record, typ=I64), ir.Constant(I64, 0))
            with b.if_then(clean):
                b.call(entry, [slots])
    b.ret_void()
    return fn


def _load(b: ir.IRBuilder, base: ir.Value, index) -> ir.Value:
    """The i64 at ``base[index]``."""
    index = ir.Constant(I64, index) if isinstance(index, int) else index
    return b.load(b.gep(base, [index], source_etype=I64), typ=I64)
