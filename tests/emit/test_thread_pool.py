"""The process-wide worker pool (emit/pool.py) behind every parallel loop: each index of a
range runs exactly once, whatever the range, the thread count, nesting, concurrent callers
from Python threads, or a fork."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llvmlite import ir

from polyonnx.emit.jit import JitModule
from polyonnx.emit.llvmtypes import I64, PTR
from polyonnx.emit.threads import (
    BODY_TYPE,
    THREADS_GLOBAL,
    parallel_for,
    register_placement_symbols,
)
from polyonnx.target import host_target

DRIVE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def _count_body(module: ir.Module, name: str, inner: bool) -> ir.Function:
    """body(ctx, lo, hi): counts[i] += 1 atomically for i in [lo, hi]; with ``inner``,
    through a nested parallel loop over that range instead."""
    fn = ir.Function(module, BODY_TYPE, name)
    ctx, lo, hi = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    if inner:
        leaf = _count_body(module, name + ".leaf", inner=False)
        b.call(parallel_for(module), [leaf, ctx, lo, b.add(hi, ir.Constant(I64, 1))])
        b.ret_void()
        return fn
    head, body, done = (fn.append_basic_block(n) for n in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(lo, fn.blocks[0])
    b.cbranch(b.icmp_signed("<=", i, hi), body, done)
    b.position_at_end(body)
    slot = b.gep(ctx, [i], source_etype=I64)
    b.atomic_rmw("add", slot, ir.Constant(I64, 1), "monotonic")
    i.add_incoming(b.add(i, ir.Constant(I64, 1)), body)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    return fn


@pytest.fixture(scope="module")
def program():
    """drive(counts, lo, hi) and drive_nested(...): run their bodies over [lo, hi) on the
    pool; ``threads`` sets the module's thread count."""
    target = host_target()
    module = ir.Module("pool_test")
    module.triple = target.triple
    for name, inner in [("drive", False), ("drive_nested", True)]:
        body = _count_body(module, name + ".body", inner)
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.call(parallel_for(module), [body, *fn.args])
        b.ret_void()
    jit = JitModule.from_module(module, target)
    threads = ctypes.c_int32.from_address(jit.global_address(THREADS_GLOBAL))

    class Program:
        keep = jit

        @staticmethod
        def run(count: int, lo: int, hi: int, workers: int, nested: bool = False):
            threads.value = workers
            counts = np.zeros(max(count, 1), dtype=np.int64)
            fn = DRIVE(jit.address("drive_nested" if nested else "drive"))
            fn(counts.ctypes.data, lo, hi)
            return counts

    return Program


def _expected(count: int, lo: int, hi: int) -> np.ndarray:
    want = np.zeros(max(count, 1), dtype=np.int64)
    want[max(lo, 0) : max(hi, 0)] = 1
    return want


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 300),
    data=st.data(),
    workers=st.sampled_from([1, 2, 3, 5, 16, 40]),
    nested=st.booleans(),
)
def test_every_index_runs_exactly_once(program, count, data, workers, nested):
    lo = data.draw(st.integers(0, count))
    hi = data.draw(st.integers(lo - 2, count))
    got = program.run(count, lo, hi, workers, nested)
    np.testing.assert_array_equal(got, _expected(count, lo, hi))


def test_many_jobs_in_a_row_and_after_the_workers_slept(program):
    for round_ in range(2000):
        count = 1 + round_ % 37
        np.testing.assert_array_equal(program.run(count, 0, count, 2), _expected(count, 0, count))
    threading.Event().wait(0.05)  # idle long enough for the workers to sleep on the futex
    np.testing.assert_array_equal(program.run(64, 0, 64, 2), _expected(64, 0, 64))


def test_concurrent_callers_from_python_threads(program):
    """ctypes drops the GIL, so these calls overlap; the one that finds the pool busy runs
    its range on its own thread."""
    failures = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(300):
            count = int(rng.integers(1, 200))
            got = program.run(count, 0, count, 2)
            if not np.array_equal(got, _expected(count, 0, count)):
                failures.append(count)

    callers = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert failures == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_its_own_workers(program):
    program.run(100, 0, 100, 2)  # the parent's workers exist
    pid = os.fork()
    if pid == 0:  # the child: the parent's workers were not copied
        ok = np.array_equal(program.run(100, 0, 100, 2), _expected(100, 0, 100))
        os._exit(0 if ok else 1)
    for _ in range(600):  # up to 30 s: a child stuck waiting for absent workers is killed
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        threading.Event().wait(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung in a parallel loop")
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity")
    or len(os.sched_getaffinity(0)) < 2
    or not register_placement_symbols(),
    reason="needs 2 cores or more and libc's sched_getcpu and pthread_setaffinity_np",
)
def test_the_workers_keep_off_the_callers_core(program):
    """A job allows the workers every core of the caller's affinity but the caller's own
    (woken onto the busy caller's core, a worker left it every chunk: emit/pool.py)."""
    libc = ctypes.CDLL(None)
    allowed = os.sched_getaffinity(0)
    placed = []
    for _ in range(50):  # the caller may move between cores mid-job: then try again
        core = libc.sched_getcpu()
        program.run(100, 0, 100, 2)
        if libc.sched_getcpu() == core:
            placed.append(allowed - {core} in _thread_cores())
        if any(placed):
            break
    assert placed, "the caller moved between cores during every job"
    assert any(placed), "no worker's cores left out the caller's"


def _thread_cores() -> list[set[int]]:
    """Each thread's allowed cores (one that exits meanwhile is left out)."""
    found = []
    for tid in os.listdir("/proc/self/task"):
        try:
            found.append(os.sched_getaffinity(int(tid)))
        except ProcessLookupError:
            continue
    return found
