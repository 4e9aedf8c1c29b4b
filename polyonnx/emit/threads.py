"""Threads inside the compiled model, with no Python per iteration.

A parallel loop's body is outlined into ``void body(ptr ctx, i64 lo, i64 hi)`` (hi
inclusive) and run through ``polyonnx_parallel_for(body, ctx, lo, hi_excl)``, generated
here in IR: it cuts the range into one contiguous chunk per thread, starts T-1 pthreads,
runs the first chunk itself and joins. The thread count is the module global
``polyonnx_threads`` (1 until the runtime sets it). A chunk whose thread cannot be
started runs on the calling thread.
"""

from __future__ import annotations

import ctypes
from functools import cache

import llvmlite.binding as llvm
from llvmlite import ir

from polyonnx.emit.llvmtypes import I64, PTR

THREADS_GLOBAL = "polyonnx_threads"
PARALLEL_FOR = "polyonnx_parallel_for"
I32 = ir.IntType(32)
BODY_TYPE = ir.FunctionType(ir.VoidType(), [PTR, I64, I64])


@cache
def register_runtime_symbols() -> bool:
    """Make libc's pthread functions known to the JIT; False if they are not there."""
    libc = ctypes.CDLL(None)
    for name in ("pthread_create", "pthread_join", "pthread_attr_init", "pthread_attr_setstack"):
        fn = getattr(libc, name, None)
        if fn is None:
            return False
        llvm.add_symbol(name, ctypes.cast(fn, ctypes.c_void_p).value)
    return True


def parallel_for(module: ir.Module) -> ir.Function:
    """The module's ``polyonnx_parallel_for`` (defined on first use)."""
    existing = module.globals.get(PARALLEL_FOR)
    if existing is not None:
        return existing
    threads = ir.GlobalVariable(module, I32, THREADS_GLOBAL)
    threads.initializer = ir.Constant(I32, 1)
    trampoline = _trampoline(module)
    create = ir.Function(module, ir.FunctionType(I32, [PTR, PTR, PTR, PTR]), "pthread_create")
    attr_init = ir.Function(module, ir.FunctionType(I32, [PTR]), "pthread_attr_init")
    set_stack = ir.Function(module, ir.FunctionType(I32, [PTR, PTR, I64]), "pthread_attr_setstack")
    stacks = ir.GlobalVariable(module, PTR, STACKS)
    stacks.initializer = ir.Constant(PTR, None)
    join = ir.Function(module, ir.FunctionType(I32, [I64, PTR]), "pthread_join")
    signature = [BODY_TYPE.as_pointer(), PTR, I64, I64]  # typed: llvmlite calls through it
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), signature), PARALLEL_FOR)
    body, ctx, lo, hi = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    count = b.sub(hi, lo)
    wanted = b.sext(b.load(threads, typ=I32), I64)
    chunks = b.select(b.icmp_signed("<", count, wanted), count, wanted)
    with b.if_then(b.icmp_signed("<=", chunks, ir.Constant(I64, 1)), likely=False):
        with b.if_then(b.icmp_signed(">", count, ir.Constant(I64, 0))):
            b.call(body, [ctx, lo, b.sub(hi, ir.Constant(I64, 1))])
        b.ret_void()
    size = b.sdiv(b.add(count, b.sub(chunks, ir.Constant(I64, 1))), chunks)  # ceil
    tids = b.alloca(I64, chunks, "tids")
    started = b.alloca(ir.IntType(8), chunks, "started")
    args = b.alloca(I64, b.mul(chunks, ir.Constant(I64, 4)), "args")
    attrs = b.alloca(I64, b.mul(chunks, ir.Constant(I64, ATTR_WORDS)), "attrs")
    region = b.load(stacks, typ=PTR)
    owned = b.icmp_unsigned("!=", b.ptrtoint(region, I64), ir.Constant(I64, 0))

    def chunk_bounds(c):
        start = b.add(lo, b.mul(c, size))
        end = b.add(start, size)
        end = b.select(b.icmp_signed("<", end, hi), end, hi)
        return start, b.sub(end, ir.Constant(I64, 1))

    with _count_loop(b, ir.Constant(I64, 1), chunks) as c:
        start, last = chunk_bounds(c)
        slot = b.gep(args, [b.mul(c, ir.Constant(I64, 4))], source_etype=I64)
        for k, value in enumerate([b.ptrtoint(body, I64), b.ptrtoint(ctx, I64), start, last]):
            b.store(value, b.gep(slot, [ir.Constant(I64, k)], source_etype=I64))
        tid = b.gep(tids, [c], source_etype=I64)
        attr = b.gep(attrs, [b.mul(c, ir.Constant(I64, ATTR_WORDS))], source_etype=I64)
        b.call(attr_init, [attr])
        with b.if_then(b.and_(owned, b.icmp_signed("<=", c, ir.Constant(I64, WORKERS)))):
            base = b.mul(b.sub(c, ir.Constant(I64, 1)), ir.Constant(I64, STACK_BYTES))
            stack = b.gep(region, [base], source_etype=ir.IntType(8))
            b.call(set_stack, [attr, stack, ir.Constant(I64, STACK_BYTES)])
        rc = b.call(create, [tid, attr, trampoline, slot])
        ok = b.icmp_signed("==", rc, ir.Constant(I32, 0))
        b.store(b.zext(ok, ir.IntType(8)), b.gep(started, [c], source_etype=ir.IntType(8)))
        with b.if_then(b.not_(ok), likely=False):
            b.call(body, [ctx, start, last])
    first_start, first_last = chunk_bounds(ir.Constant(I64, 0))
    b.call(body, [ctx, first_start, first_last])
    with _count_loop(b, ir.Constant(I64, 1), chunks) as c:
        flag = b.load(b.gep(started, [c], source_etype=ir.IntType(8)), typ=ir.IntType(8))
        with b.if_then(b.icmp_unsigned("!=", flag, ir.Constant(ir.IntType(8), 0))):
            tid = b.load(b.gep(tids, [c], source_etype=I64), typ=I64)
            b.call(join, [tid, ir.Constant(PTR, None)])
    b.ret_void()
    return fn


STACKS = "polyonnx_stacks"
WORKERS = 15
STACK_BYTES = 4 << 20
"""Workers 1..WORKERS run on stacks in a region the runtime maps once per compiled model
and stores in the module global ``polyonnx_stacks`` (null: glibc's stacks): glibc hands
a joined thread's stack pages back to the kernel (madvise), so a fresh thread's scratch
(a GEMM's packed panels, ~1 MB) would be page-faulted in again on every call. Pages of
this region, once touched, stay. Untouched, it costs address space only."""
ATTR_WORDS = 8
"""A pthread_attr_t (56 bytes on glibc x86-64), in i64 words."""


def _trampoline(module: ir.Module) -> ir.Function:
    """``ptr trampoline(ptr args)``: the pthread entry, calling body(ctx, lo, hi)."""
    fn = ir.Function(module, ir.FunctionType(PTR, [PTR]), "polyonnx_trampoline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    slot = fn.args[0]
    words = [
        b.load(b.gep(slot, [ir.Constant(I64, k)], source_etype=I64), typ=I64) for k in range(4)
    ]
    body = b.inttoptr(words[0], BODY_TYPE.as_pointer())
    b.call(body, [b.inttoptr(words[1], PTR), words[2], words[3]])
    b.ret(ir.Constant(PTR, None))
    return fn


class _count_loop:
    """``for (c = start; c < stop; c++)`` around the with-block; yields c."""

    def __init__(self, b: ir.IRBuilder, start: ir.Value, stop: ir.Value):
        self.b, self.start, self.stop = b, start, stop

    def __enter__(self) -> ir.Value:
        b = self.b
        self.pre = b.block
        self.head = b.append_basic_block("c.head")
        self.body = b.append_basic_block("c.body")
        self.exit = b.append_basic_block("c.exit")
        b.branch(self.head)
        b.position_at_end(self.head)
        self.c = b.phi(I64, "c")
        self.c.add_incoming(self.start, self.pre)
        b.cbranch(b.icmp_signed("<", self.c, self.stop), self.body, self.exit)
        b.position_at_end(self.body)
        return self.c

    def __exit__(self, *exc) -> None:
        b = self.b
        self.c.add_incoming(b.add(self.c, ir.Constant(I64, 1)), b.block)
        b.branch(self.head)
        b.position_at_end(self.exit)
