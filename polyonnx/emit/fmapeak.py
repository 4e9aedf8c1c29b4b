"""The measured fp32 FMA peak of one core: a JIT-compiled loop of independent vector FMAs,
timed. It is what a contraction's GFLOP/s is compared with where no clock can be read
(a VM's /proc/cpuinfo gives the nominal clock, and sysfs often no cpufreq at all).

    loop: acc[i] = fma(x, x, acc[i])   for i in 0..ACCUMULATORS, W lanes each

With more independent accumulators than FMA latency x pipes (4 x 2 on Zen 3 and 4), the
loop is bound by FMA throughput alone: 2 flops x W lanes x FMAs retired a cycle.
"""

from __future__ import annotations

import ctypes
import time

from llvmlite import ir

from polyonnx.emit.jit import JitModule
from polyonnx.emit.llvmtypes import splat
from polyonnx.target import Target

ACCUMULATORS = 12
"""Independent chains: at least FMA latency x pipes, and few enough for AVX2's 16 vector
registers (x, and the loop's own)."""


def fma_peak_gflops(target: Target, trials: int = 5, flops: float = 4e8) -> float:
    """The best of ``trials`` timings of ``flops`` fp32 flops of independent vector FMAs on
    the calling thread, in GFLOP/s."""
    lanes = target.lanes(4)
    jit = JitModule.from_module(_module(target, lanes), target)
    kind = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_float)
    run = kind(jit.address("fma_loop"))
    steps = max(int(flops / (2 * lanes * ACCUMULATORS)), 1)
    best = 0.0
    for _ in range(trials):
        start = time.perf_counter()
        run(steps, 1e-9)
        elapsed = time.perf_counter() - start
        best = max(best, 2 * lanes * ACCUMULATORS * steps / elapsed / 1e9)
    return best


def _module(target: Target, lanes: int) -> ir.Module:
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, lanes)
    module = ir.Module("fmapeak")
    module.triple = target.triple
    fma = ir.Function(module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{lanes}f32")
    fn = ir.Function(module, ir.FunctionType(f32, [i64, f32]), "fma_loop")
    steps, seed = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x = splat(b, seed, lanes)
    entry = b.block
    loop = fn.append_basic_block("loop")
    b.branch(loop)
    b.position_at_end(loop)
    step = b.phi(i64)
    step.add_incoming(ir.Constant(i64, 0), entry)
    accs = [b.phi(vec) for _ in range(ACCUMULATORS)]
    for acc in accs:
        acc.add_incoming(ir.Constant(vec, [0.0] * lanes), entry)
    new = [b.call(fma, [x, x, acc]) for acc in accs]
    following = b.add(step, ir.Constant(i64, 1))
    step.add_incoming(following, loop)
    for acc, value in zip(accs, new, strict=True):
        acc.add_incoming(value, loop)
    done = fn.append_basic_block("done")
    b.cbranch(b.icmp_signed("<", following, steps), loop, done)
    b.position_at_end(done)
    total = new[0]
    for value in new[1:]:  # every chain is used, so none is dead code
        total = b.fadd(total, value)
    b.ret(b.extract_element(total, ir.Constant(ir.IntType(32), 0)))
    return module
