"""A process-wide pool of worker threads for the compiled models' parallel loops.

``polyonnx_pool_run(body, ctx, lo, hi_excl, threads)`` cuts ``[lo, hi_excl)`` into
``min(threads, count)`` contiguous chunks and returns once every chunk has run. It is
generated here in IR, compiled once per process (emit/threads.py) and called by every
model. Starting and joining pthreads per parallel loop cost ~60 µs a loop, more than a
whole ShuffleNet convolution; pool workers are started once, on first need.

- **Chunks are claimed, not assigned.** A job is published as one 64-bit ticket, its
  generation in the high half and its unclaimed chunks in the low half; the caller and the
  workers take chunks with a compare-and-swap until none is left. A worker that is late
  (asleep, or its core busy elsewhere) finds nothing to take, and the caller has run its
  chunk instead: a late worker costs parallelism, never a stall. In this VM a sleeping
  worker took ~0.85 ms to wake, ten times a whole ShuffleNet convolution.
- A chunk's fields are read only after its claim succeeded, while the job is still live
  (the caller waits for every claimed chunk before it writes the next job); the generation
  makes a claim on a finished job fail even where the next one has as many chunks.
- Idle workers spin (about SPINS pauses), then sleep on a futex word that the caller bumps
  with each job; it wakes them only when one sleeps. A woken worker spins afresh, so that
  one woken too late for a short job is awake for the ones that follow it.
- **Workers keep off the caller's core** (where libc has sched_getcpu,
  sched_getaffinity and pthread_setaffinity_np): each job looks up the core the caller
  runs on, and when it changed (or workers started), allows the workers every core of the
  caller's own affinity but that one. In this VM a worker woken from its futex was often
  queued behind the busy caller on the caller's core for milliseconds; the caller then ran
  every chunk itself, and now and then waited ~1.6 ms for a chunk the worker claimed
  there. A 1x1 Conv 64 -> 256 at 56 on 2 threads, rounds alternating with onnxruntime
  after quiet pauses: per-round ratio 1.26-1.27 (quartiles 0.82-2.09) -> 0.81-0.83
  (0.80-0.85); in the perf suite the paired 2-thread ratios, e.g. the stem Conv 1.27 ->
  0.96, Softmax 1.54 -> 0.92. With more than 2 cores the workers may run on any other
  allowed one, and the caller anywhere; with 2, the worker is held to one core, so a
  caller that waits SPINS pauses on a chunk (its worker starved by another process there)
  frees the workers' cores again.
- One job at a time: a call that finds the pool busy (a parallel loop inside a parallel
  loop, or a second Python thread) runs its range serially on its own thread.
- A forked child (its pid differs from the one that started the workers) starts its own.
"""

from __future__ import annotations

from llvmlite import ir

from polyonnx.emit.llvmtypes import I64, PTR

POOL_RUN = "polyonnx_pool_run"
MAX_WORKERS = 15
STACK_BYTES = 4 << 20
"""Each worker's stack. Persistent threads keep their stack pages, so a GEMM's packed
panels (up to schedule/heuristics/gemm_defaults.py's SCRATCH_BYTES) are page-faulted in
once per process."""
SPINS = 1 << 16
"""Pauses (27 ns each on Zen 4, so ~1.8 ms) an idle worker spins for before it sleeps:
the kernels of a model, and back-to-back runs, find it awake; an idle process stops
using the core soon after."""
I32 = ir.IntType(32)
VOID = ir.VoidType()
BODY_TYPE = ir.FunctionType(VOID, [PTR, I64, I64])
FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98, "riscv64": 98, "powerpc64le": 221}
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129


PLACEMENT_FUNCTIONS = ("sched_getcpu", "sched_getaffinity", "pthread_setaffinity_np")
"""The libc functions that keep workers off the caller's core; without them, no placement."""
CPU_SET_WORDS = 16
"""A cpu_set_t: 1024 bits. The caller's core, if past it, is not kept clear."""
CPU_SET_BYTES = 8 * CPU_SET_WORDS


def pool_module(triple: str, placement: bool = False) -> ir.Module:
    """The module defining POOL_RUN for a process on ``triple``; ``placement``: keep the
    workers off the caller's core (PLACEMENT_FUNCTIONS are available)."""
    module = ir.Module("polyonnx_pool")
    module.triple = triple
    pool = _Pool(module, triple.split("-")[0], placement)
    pool.define_run(pool.define_worker())
    return module


class _Pool:
    """The pool's globals and the libc functions it calls, in ``module``."""

    def __init__(self, module: ir.Module, arch: str, placement: bool = False):
        self.module = module
        self.arch = arch
        self.placement = placement
        self.lock = self._global("lock", I32, 0)
        self.ticket = self._global("ticket", I64, 0)  # generation << 32 | unclaimed chunks
        self.done = self._global("done", I64, 0)  # chunks of the current job finished
        self.wakeups = self._global("wakeups", I32, 0)  # the futex word: + 1 per job
        self.sleepers = self._global("sleepers", I32, 0)
        self.workers = self._global("workers", I64, 0)
        self.pid = self._global("pid", I32, 0)
        self.job_body = self._global("job.body", PTR, None)
        self.job_ctx = self._global("job.ctx", PTR, None)
        self.job_lo = self._global("job.lo", I64, 0)
        self.job_hi = self._global("job.hi", I64, 0)
        self.job_size = self._global("job.size", I64, 0)
        self.handles = self._global("handles", ir.ArrayType(I64, MAX_WORKERS), None)
        self.caller_cpu = self._global("caller.cpu", I32, -1)  # the workers keep off it
        self.placed = self._global("placed", I64, 0)  # workers whose cores were set for it
        fn = ir.Function
        self.create = fn(module, ir.FunctionType(I32, [PTR, PTR, PTR, PTR]), "pthread_create")
        self.attr_init = fn(module, ir.FunctionType(I32, [PTR]), "pthread_attr_init")
        self.attr_stack = fn(module, ir.FunctionType(I32, [PTR, I64]), "pthread_attr_setstacksize")
        self.attr_destroy = fn(module, ir.FunctionType(I32, [PTR]), "pthread_attr_destroy")
        self.getpid = fn(module, ir.FunctionType(I32, []), "getpid")
        self.syscall = fn(module, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
        self.usleep = fn(module, ir.FunctionType(I32, [I32]), "usleep")
        self.sched_yield = fn(module, ir.FunctionType(I32, []), "sched_yield")
        if placement:
            self.getcpu = fn(module, ir.FunctionType(I32, []), "sched_getcpu")
            signature = ir.FunctionType(I32, [I32, I64, PTR])
            self.getaffinity = fn(module, signature, "sched_getaffinity")
            self.setaffinity = fn(
                module, ir.FunctionType(I32, [I64, I64, PTR]), "pthread_setaffinity_np"
            )

    def _global(self, name: str, typ: ir.Type, value) -> ir.GlobalVariable:
        var = ir.GlobalVariable(self.module, typ, f"polyonnx_pool.{name}")
        var.initializer = ir.Constant(typ, value)
        var.linkage = "internal"
        var.align = 64  # a cache line each: the ticket, done and wakeups are contended
        return var

    # ---- the calling side ---------------------------------------------------------------

    def define_run(self, worker: ir.Function) -> ir.Function:
        signature = ir.FunctionType(VOID, [BODY_TYPE.as_pointer(), PTR, I64, I64, I32])
        fn = ir.Function(self.module, signature, POOL_RUN)
        body, ctx, lo, hi, threads = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        one = ir.Constant(I64, 1)
        count = b.sub(hi, lo)
        wanted = _min(b, b.sext(threads, I64), ir.Constant(I64, MAX_WORKERS + 1))
        chunks = _min(b, count, wanted)
        with b.if_then(b.icmp_signed("<=", chunks, one), likely=False):
            with b.if_then(b.icmp_signed(">", count, ir.Constant(I64, 0))):
                b.call(body, [ctx, lo, b.sub(hi, one)])
            b.ret_void()
        pid = b.call(self.getpid, [])
        with b.if_then(b.icmp_signed("!=", pid, b.load(self.pid, typ=I32)), likely=False):
            for var in (self.lock, self.sleepers):  # a forked child: no workers, no job
                b.store(ir.Constant(I32, 0), var)
            b.store(ir.Constant(I32, -1), self.caller_cpu)
            for var in (self.workers, self.placed):
                b.store(ir.Constant(I64, 0), var)
            b.store(pid, self.pid)
        free, busy = ir.Constant(I32, 0), ir.Constant(I32, 1)
        taken = b.cmpxchg(self.lock, free, busy, "acquire", "monotonic")
        with b.if_then(b.not_(b.extract_value(taken, 1)), likely=False):
            b.call(body, [ctx, lo, b.sub(hi, one)])  # busy: nested or concurrent
            b.ret_void()
        self._start_workers(b, worker, b.sub(chunks, one))
        if self.placement:
            self._keep_off_caller(b)
        size = b.sdiv(b.add(count, b.sub(chunks, one)), chunks)
        chunks = b.sdiv(b.add(count, b.sub(size, one)), size)  # none empty
        fields = [(self.job_body, b.bitcast(body, PTR)), (self.job_ctx, ctx)]
        fields += [(self.job_lo, lo), (self.job_hi, hi), (self.job_size, size)]
        for var, value in fields:
            b.store(value, var)
        b.store(ir.Constant(I64, 0), self.done)
        generation = b.add(b.lshr(b.load(self.ticket, typ=I64), ir.Constant(I64, 32)), one)
        ticket = b.or_(b.shl(generation, ir.Constant(I64, 32)), chunks)
        b.store_atomic(ticket, self.ticket, "seq_cst", 8)  # publishes the fields
        b.atomic_rmw("add", self.wakeups, ir.Constant(I32, 1), "seq_cst")
        sleeping = b.load_atomic(self.sleepers, "seq_cst", 4, typ=I32)
        with b.if_then(b.icmp_signed(">", sleeping, ir.Constant(I32, 0)), likely=False):
            self._futex(b, FUTEX_WAKE_PRIVATE, ir.Constant(I32, 0x7FFFFFFF))
        self._claim_chunks(b)
        self._wait_for(b, chunks)
        b.store_atomic(ir.Constant(I32, 0), self.lock, "release", 4)
        b.ret_void()
        return fn

    def _start_workers(self, b: ir.IRBuilder, worker: ir.Function, needed: ir.Value) -> None:
        """Start workers until ``needed`` run (or one fails to start)."""
        fn = b.function
        tid = b.alloca(I64, name="tid")
        attr = b.alloca(I64, ir.Constant(I64, 16), name="attr")  # pthread_attr_t: 56 bytes
        head, grow, done = (fn.append_basic_block(n) for n in ("grow.head", "grow", "grow.done"))
        b.branch(head)
        b.position_at_end(head)
        have = b.load(self.workers, typ=I64)
        limit = _min(b, needed, ir.Constant(I64, MAX_WORKERS))
        b.cbranch(b.icmp_signed("<", have, limit), grow, done)
        b.position_at_end(grow)
        b.call(self.attr_init, [attr])
        b.call(self.attr_stack, [attr, ir.Constant(I64, STACK_BYTES)])
        rc = b.call(self.create, [tid, attr, worker, ir.Constant(PTR, None)])
        b.call(self.attr_destroy, [attr])
        started = b.icmp_signed("==", rc, ir.Constant(I32, 0))
        with b.if_then(started):
            b.store(b.load(tid, typ=I64), self._handle(b, have))
            b.store(b.add(have, ir.Constant(I64, 1)), self.workers)
        b.cbranch(started, head, done)
        b.position_at_end(done)

    def _keep_off_caller(self, b: ir.IRBuilder) -> None:
        """Where the caller's core changed (or workers started) since the last job: allow
        every worker the cores of the caller's affinity but the caller's own (where that
        leaves any: a caller allowed one core leaves the workers theirs)."""
        cpu = b.call(self.getcpu, [])
        have = b.load(self.workers, typ=I64)
        moved = b.icmp_signed("!=", cpu, b.load(self.caller_cpu, typ=I32))
        grown = b.icmp_signed("!=", have, b.load(self.placed, typ=I64))
        known = b.icmp_unsigned("<", cpu, ir.Constant(I32, 64 * CPU_SET_WORDS))  # not -1
        with b.if_then(b.and_(known, b.or_(moved, grown)), likely=False):
            b.store(cpu, self.caller_cpu)
            b.store(have, self.placed)
            mask, got = self._caller_cores(b)
            with b.if_then(got):
                index = b.zext(b.lshr(cpu, ir.Constant(I32, 6)), I64)
                word = b.gep(mask, [index], source_etype=I64)
                bit = b.shl(ir.Constant(I64, 1), b.zext(b.and_(cpu, ir.Constant(I32, 63)), I64))
                b.store(b.and_(b.load(word, typ=I64), b.not_(bit)), word)
                others = ir.Constant(I64, 0)
                for w in range(CPU_SET_WORDS):
                    at = b.gep(mask, [ir.Constant(I64, w)], source_etype=I64)
                    others = b.or_(others, b.load(at, typ=I64))
                with b.if_then(b.icmp_unsigned("!=", others, ir.Constant(I64, 0))):
                    self._set_worker_cores(b, have, mask)

    def _free_workers(self, b: ir.IRBuilder) -> None:
        """Allow the workers every core of the caller's affinity again, and place them anew
        at the next job: a worker kept off the caller's core cannot move to it when its
        own core is busy with another process."""
        b.store(ir.Constant(I32, -1), self.caller_cpu)
        mask, got = self._caller_cores(b)
        with b.if_then(got):
            self._set_worker_cores(b, b.load(self.workers, typ=I64), mask)

    def _caller_cores(self, b: ir.IRBuilder) -> tuple[ir.Value, ir.Value]:
        """The calling thread's affinity as a cpu_set_t on the stack, and whether it was read
        (a kernel of more than 1024 cores fails the call)."""
        with b.goto_block(b.function.entry_basic_block):
            mask = b.alloca(I64, ir.Constant(I64, CPU_SET_WORDS), name="cores")
        size = ir.Constant(I64, CPU_SET_BYTES)
        rc = b.call(self.getaffinity, [ir.Constant(I32, 0), size, mask])
        return mask, b.icmp_signed("==", rc, ir.Constant(I32, 0))

    def _set_worker_cores(self, b: ir.IRBuilder, have: ir.Value, mask: ir.Value) -> None:
        """pthread_setaffinity_np(worker, mask) for the first ``have`` workers."""
        fn = b.function
        head, body, done = (fn.append_basic_block(n) for n in ("cores.head", "cores", "cores.set"))
        pre = b.block
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, "worker")
        i.add_incoming(ir.Constant(I64, 0), pre)
        b.cbranch(b.icmp_signed("<", i, have), body, done)
        b.position_at_end(body)
        size = ir.Constant(I64, CPU_SET_BYTES)
        b.call(self.setaffinity, [b.load(self._handle(b, i), typ=I64), size, mask])
        i.add_incoming(b.add(i, ir.Constant(I64, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    def _handle(self, b: ir.IRBuilder, index: ir.Value) -> ir.Value:
        """Where worker ``index``'s pthread_t is kept (cast: llvmlite types this gep as a
        pointer to the array)."""
        at = b.gep(self.handles, [ir.Constant(I64, 0), index], source_etype=self.handles.value_type)
        return b.bitcast(at, I64.as_pointer())

    def _wait_for(self, b: ir.IRBuilder, chunks: ir.Value) -> None:
        """Wait until ``chunks`` chunks are done: spin, and after SPINS pauses yield the core
        at each check (the worker running the last chunk may be waiting for it)."""
        fn = b.function
        spins = b.alloca(I32, name="join.spins")
        b.store(ir.Constant(I32, 0), spins)
        names = ("join", "join.wait", "join.yield", "join.pause", "joined")
        head, wait, give, pause, done = (fn.append_basic_block(n) for n in names)
        b.branch(head)
        b.position_at_end(head)
        finished = b.load_atomic(self.done, "acquire", 8, typ=I64)
        b.cbranch(b.icmp_signed(">=", finished, chunks), done, wait)
        b.position_at_end(wait)
        count = b.load(spins, typ=I32)
        b.store(b.add(count, ir.Constant(I32, 1)), spins)
        b.cbranch(b.icmp_unsigned("<", count, ir.Constant(I32, SPINS)), pause, give)
        b.position_at_end(pause)
        self._pause(b)
        b.branch(head)
        b.position_at_end(give)
        if self.placement:  # a claimed chunk takes long: its worker may be starved
            first = b.icmp_unsigned("==", count, ir.Constant(I32, SPINS))
            with b.if_then(first, likely=False):
                self._free_workers(b)
        b.call(self.sched_yield, [])
        b.branch(head)
        b.position_at_end(done)

    # ---- the worker side ----------------------------------------------------------------

    def define_worker(self) -> ir.Function:
        """``ptr worker(ptr)``: claim chunks while a job has some, else spin, else sleep."""
        fn = ir.Function(self.module, ir.FunctionType(PTR, [PTR]), "polyonnx_pool.worker")
        fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        spins = b.alloca(I32, name="spins")
        names = ("work", "wait", "spin", "sleep")
        work, wait, spin, sleep = (fn.append_basic_block(n) for n in names)
        b.branch(work)

        b.position_at_end(work)
        self._claim_chunks(b)
        b.store(ir.Constant(I32, 0), spins)
        b.branch(wait)

        b.position_at_end(wait)
        b.cbranch(self._has_chunks(b, "acquire"), work, spin)

        b.position_at_end(spin)
        count = b.load(spins, typ=I32)
        b.store(b.add(count, ir.Constant(I32, 1)), spins)
        keep_spinning = fn.append_basic_block("spin.pause")
        b.cbranch(b.icmp_unsigned("<", count, ir.Constant(I32, SPINS)), keep_spinning, sleep)
        b.position_at_end(keep_spinning)
        self._pause(b)
        b.branch(wait)

        b.position_at_end(sleep)  # the caller bumps wakeups after the ticket, then reads
        b.atomic_rmw("add", self.sleepers, ir.Constant(I32, 1), "seq_cst")  # sleepers
        seen = b.load_atomic(self.wakeups, "seq_cst", 4, typ=I32)
        with b.if_then(b.not_(self._has_chunks(b, "seq_cst"))):
            self._futex(b, FUTEX_WAIT_PRIVATE, seen)
        b.atomic_rmw("sub", self.sleepers, ir.Constant(I32, 1), "seq_cst")
        # Woken (or the job came first): spin afresh. A worker woken too late for a short
        # job, which the caller has finished alone, would otherwise sleep again at once and
        # be late for every job after it: the next model kernels come right after.
        b.store(ir.Constant(I32, 0), spins)
        b.branch(wait)
        return fn

    # ---- shared pieces ------------------------------------------------------------------

    def _has_chunks(self, b: ir.IRBuilder, ordering: str) -> ir.Value:
        ticket = b.load_atomic(self.ticket, ordering, 8, typ=I64)
        return b.icmp_unsigned("!=", b.trunc(ticket, I32), ir.Constant(I32, 0))

    def _claim_chunks(self, b: ir.IRBuilder) -> None:
        """Take and run chunks of the current job until it has none left."""
        fn = b.function
        names = ("claim", "claim.try", "claim.run", "claimed")
        head, attempt, run, done = (fn.append_basic_block(n) for n in names)
        b.branch(head)
        b.position_at_end(head)
        ticket = b.load_atomic(self.ticket, "monotonic", 8, typ=I64)
        left = b.and_(ticket, ir.Constant(I64, 0xFFFFFFFF))
        b.cbranch(b.icmp_unsigned("==", left, ir.Constant(I64, 0)), done, attempt)
        b.position_at_end(attempt)
        swapped = b.cmpxchg(
            self.ticket, ticket, b.sub(ticket, ir.Constant(I64, 1)), "acq_rel", "monotonic"
        )
        b.cbranch(b.extract_value(swapped, 1), run, head)
        b.position_at_end(run)
        self._run_chunk(b, b.sub(left, ir.Constant(I64, 1)))
        b.atomic_rmw("add", self.done, ir.Constant(I64, 1), "release")
        b.branch(head)
        b.position_at_end(done)

    def _run_chunk(self, b: ir.IRBuilder, index: ir.Value) -> None:
        """body(ctx, start, last) for chunk ``index`` of the current job."""
        size = b.load(self.job_size, typ=I64)
        start = b.add(b.load(self.job_lo, typ=I64), b.mul(index, size))
        end = _min(b, b.add(start, size), b.load(self.job_hi, typ=I64))
        body = b.inttoptr(b.load(self.job_body, typ=I64), BODY_TYPE.as_pointer())
        ctx = b.load(self.job_ctx, typ=PTR)
        b.call(body, [ctx, start, b.sub(end, ir.Constant(I64, 1))])

    def _futex(self, b: ir.IRBuilder, op: int, value: ir.Value) -> None:
        """futex(wakeups, op, value); where futex is unknown, a 50 µs nap instead."""
        number = FUTEX_SYSCALL.get(self.arch)
        if number is None:
            if op == FUTEX_WAIT_PRIVATE:
                b.call(self.usleep, [ir.Constant(I32, 50)])
            return
        args = [ir.Constant(I64, number), self.wakeups, ir.Constant(I64, op)]
        b.call(self.syscall, [*args, b.sext(value, I64), ir.Constant(PTR, None)])

    def _pause(self, b: ir.IRBuilder) -> None:
        """The CPU's spin-wait hint, where we know it."""
        if self.arch == "x86_64":
            b.call(self._intrinsic("llvm.x86.sse2.pause", []), [])
        elif self.arch == "aarch64":
            b.call(self._intrinsic("llvm.aarch64.hint", [I32]), [ir.Constant(I32, 1)])  # yield
        else:
            b.fence("seq_cst")

    def _intrinsic(self, name: str, args: list[ir.Type]) -> ir.Function:
        existing = self.module.globals.get(name)
        return existing or ir.Function(self.module, ir.FunctionType(VOID, args), name)


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)
