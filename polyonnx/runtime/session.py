"""``InferenceSession``: onnxruntime's surface over polyonnx-compiled native code.

A model that keeps its samples apart along a symbolic dim (its batch; frontend/batch.py
proves it) is compiled once, for one sample, and runs any batch size in blocks
(runtime/blocks.py). A model with other symbolic input dims is compiled once with them
as isl parameters where it can be (runtime/parametric.py), else once per distinct input
shape (shape specialisation: constant trip counts make better loops) and cached. Code
laid out for where an input's data starts past a cache line (a one-row MatMul's big B,
krnl/ops/matmul.py's INPUT_OFFSET) is compiled once per start met, too.
Every input is validated — name, dtype, rank, shape — before native code runs.

``profile=True`` compiles every specialisation with per-kernel timers::

    session = InferenceSession("model.onnx", threads=1, profile=True)
    session.run(None, feed)
    for record in session.kernel_profile():   # kernel, op_type, seconds, calls, share
        ...
    session.reset_profile()
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Protocol

import numpy as np
import onnx

from polyonnx.aligned import ALIGN
from polyonnx.errors import (
    ArgumentError,
    InputError,
    PolyonnxError,
    ValueRequiredError,
    describe,
)
from polyonnx.frontend.graph import Dim, Graph, Value
from polyonnx.frontend.limits import Limits
from polyonnx.frontend.load import load_graph, load_model, model_digest
from polyonnx.krnl.lower import supported_ops
from polyonnx.runtime.arguments import flag, model_argument, path_option, thread_count
from polyonnx.runtime.blocks import Blocked, first_block, plan_along, resized
from polyonnx.runtime.cache import CompileCache, cache_key, enabled_by_default
from polyonnx.runtime.compiled import (
    CompiledModel,
    KernelProfile,
    compile_graph,
    compile_program,
)
from polyonnx.runtime.library import LibraryModel, is_library
from polyonnx.runtime.parametric import (
    ParametricModel,
    compile_parametric,
    graph_at,
    jit_parametric,
    plan_parametric,
)
from polyonnx.runtime.special import Specialised, specialize_argument
from polyonnx.target import Target, host_target, llvm_version

RECENT = 256
"""How many feed shapes a session remembers the runner of."""
ORT_TYPES = {"float32": "float", "float64": "double"}


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime describes it."""

    name: str
    shape: list[int | str | None]
    type: str


def node_arg(value: Value) -> NodeArg:
    """As onnxruntime shows it: ints, dim_param names, and None for unnamed dims (the
    names polyonnx or shape inference made up for them)."""
    shape = [None if _made_up(d) else d for d in value.shape]
    return NodeArg(value.name, shape, f"tensor({ORT_TYPES.get(value.dtype, value.dtype)})")


class ScheduleRecords(Protocol):
    """What a session asks of tuning records."""

    skipped: list[str]

    def schedules(self, program, defaults): ...

    def fingerprint(self) -> list: ...


def _compile_cache(cache: bool | str | os.PathLike | None) -> CompileCache | None:
    if cache is None:
        cache = enabled_by_default()
    if cache is False:
        return None
    return CompileCache(None if cache is True else cache)


def _made_up(dim: Dim) -> bool:
    return isinstance(dim, str) and (dim.startswith("?") or dim.startswith("unk__"))


class InferenceSession:
    def __init__(
        self,
        model: str | os.PathLike | bytes | onnx.ModelProto,
        threads: int | None = None,
        *,
        target: Target | None = None,
        profile: bool = False,
        records: ScheduleRecords | None = None,
        cache: bool | str | os.PathLike | None = None,
        limits: Limits | None = None,
        checks: bool = True,
        specialize: Mapping[str, Sequence[int]] | None = None,
    ):
        """``model``: an ONNX model (path, bytes or proto), a ``polyonnx.Program``, or a
        library written by ``polyonnx compile`` (``.../libNAME.so``: loaded, not compiled).
        ``profile``: time every kernel call (see :meth:`kernel_profile`).
        ``records``: tuning records that schedule the kernels they beat the default on
        (tune/apply.py's Records; ``polyonnx.InferenceSession`` loads them from
        ``tuning_db``). This layer runs what it is handed and imports no tuner.
        ``cache``: keep compiled code on disk and load it instead of compiling again
        (runtime/cache.py): True, False, or the cache's directory; by default on unless
        POLYONNX_CACHE=off. ``limits``: the size budget the model must fit in
        (docs/limits.md; by default Limits.from_env()). ``checks``: native code checks
        user-given indices and integer divisors and raises RunError (docs/ops.md); False
        compiles them out (bad values are then clamped or divide to 0). ``specialize``:
        symbolic dim name -> sizes whose code is compiled, in the background, specialised
        to them (runtime/special.py); other sizes run one compile in blocks. Every argument is
        checked first: a bad model raises ModelError, any other bad argument ArgumentError."""
        model_argument(model)
        self.threads = thread_count(threads)
        self._target = _checked_target(target)
        self.profiling = flag("profile", profile)
        self.checks = flag("checks", checks)
        self._specialize = specialize_argument(specialize)
        self._special = Specialised(self._compile_special)
        records = _checked_records(records)
        cache = path_option("cache", cache, directory=True)
        self._limits = _checked_limits(limits)
        self._inputs: dict[str, tuple[Value, np.dtype, tuple | None]] | None = None
        self._compiled: dict[tuple, CompiledModel | LibraryModel] = {}
        self._blocked: dict[tuple, Blocked | None] = {}
        """Per batch symbol and the other dims: the model run in blocks, or None."""
        self._valid_shapes: set[tuple] = set()
        """Input shapes (in the inputs' order) validated before: their symbols agree."""
        self._recent: dict[tuple, Blocked] = {}
        """The runner of the shapes of a feed (in the inputs' order), once found."""
        self.not_blocked: dict[str, str] = {}
        """Per symbolic dim tried as a batch and refused: why (frontend/batch.py)."""
        self._parametric: ParametricModel | bool | None = False
        """The model compiled with its symbolic dims as parameters; None where it could
        not be (why: ``not_parametric``); False before it was tried."""
        self.not_parametric: str | None = None
        self.compile_count = 0
        """How many specialisations were compiled or loaded from the compile cache."""
        self._last: CompiledModel | LibraryModel | None = None
        """The specialisation that ran last (whose profile ``kernel_profile`` reads)."""
        self._value_inputs: list[str] = []
        """Inputs whose values lowering needs (axes, shapes): compiled per value."""
        self._offset_inputs: list[str] = []
        """Inputs whose code is laid out for where their data starts past a cache line
        (Program.input_offsets): compiled per start met (a one-row MatMul's big B)."""
        self.records = None
        self._cache = None
        self._digest: str | None = None
        if is_library(model):
            if self.profiling:
                raise ArgumentError(
                    "profile=True: a compiled library has no kernel timers; profile the .onnx "
                    "model instead"
                )
            self._open_library(model)
            return
        self.records = records
        if _is_program(model):  # a polyonnx.Program with scripted schedules: not cached
            self._set_graph(model.graph)
            self._model = None
            if getattr(model, "fitted", None) is not None:  # parametric: once for every size
                self._parametric = _scripted_parametric(model, target, self.checks)
                self._parametric.set_threads(self.threads)
                self.compile_count += 1
                return
            compiled = compile_program(
                *model.compilable(), target, profile=self.profiling, checks=self.checks
            )
            compiled.set_threads(self.threads)
            self._compiled[self._key({})] = compiled
            return
        self._cache = _compile_cache(cache)
        self._model = load_model(model, limits=self._limits)
        self._source = model if isinstance(model, str | os.PathLike) else self._model
        self._set_graph(
            load_graph(
                self._model, supported_ops=supported_ops(), checked=True, limits=self._limits
            )
        )
        if self._static:
            try:
                self._keep({}, self._compile(self.graph, {}))
            except ValueRequiredError as exc:
                self._value_inputs = list(exc.inputs)

    def _set_graph(self, graph: Graph | None) -> None:
        self.graph = graph
        self._static = graph is None or graph.is_static
        if graph is not None:
            self._ports = (graph.inputs, graph.outputs)

    def _open_library(self, path) -> None:
        """Run a library of ``polyonnx compile``: its ports stand for the graph's."""
        library = LibraryModel(path, self.threads)
        self._set_graph(None)
        self._model = None
        self._ports = tuple(
            tuple(Value(p.name, p.shape, p.dtype) for p in ports)
            for ports in (library.inputs, library.outputs)
        )
        self._compiled[self._key({})] = library

    def _compile(self, graph: Graph | None, feed: Mapping[str, np.ndarray]) -> CompiledModel:
        """Native code for ``graph`` (None: the model specialised to the shapes and values
        of ``feed``, loaded only when the compile cache does not have its code), else
        compiled (and stored there)."""
        offsets = self._offsets(feed)
        self.compile_count += 1
        key = None
        if self._cache is not None:
            key = self._cache_key(feed, offsets)
            entry = self._cache.load(key)
            if entry is not None:
                compiled = CompiledModel.from_entry(
                    entry, self._target or host_target(), self.profiling
                )
                compiled.set_threads(self.threads)
                return compiled
        if graph is None:
            graph = self._specialised(feed)
        compiled = compile_graph(
            graph,
            self._target,
            profile=self.profiling,
            records=self.records,
            input_offsets=offsets,
            checks=self.checks,
        )
        compiled.set_threads(self.threads)
        if key is not None:
            self._cache.store(key, compiled.cache_entry())
        return compiled

    def _specialised(
        self,
        feed: Mapping[str, np.ndarray],
        shapes: Mapping[str, tuple] | None = None,
        merge: bool = True,
    ) -> Graph:
        """The model's graph for ``feed``'s shapes (or ``shapes``) and its value inputs'
        values (``merge``: see load_graph)."""
        return load_graph(
            self._model,
            merge=merge,
            supported_ops=supported_ops(),
            input_shapes=shapes or {name: tuple(array.shape) for name, array in feed.items()},
            input_values={name: feed[name] for name in self._value_inputs},
            checked=True,
            limits=self._limits,
        )

    def _cache_key(self, feed: Mapping[str, np.ndarray], offsets: Mapping[str, int]) -> str:
        """Everything that changes the code compiled for ``feed``."""
        from polyonnx import __version__

        if self._digest is None:
            self._digest = model_digest(self._source)
        return cache_key(
            {
                "model": self._digest,
                "shapes": sorted((n, list(a.shape)) for n, a in feed.items()),
                "values": [
                    (n, feed[n].dtype.str, feed[n].tobytes().hex()) for n in self._value_inputs
                ],
                "offsets": sorted(offsets.items()),
                "target": dataclasses.asdict(self._target or host_target()),
                "polyonnx": __version__,
                "llvm": llvm_version(),
                "records": self.records.fingerprint() if self.records else None,
                "profile": self.profiling,
                "checks": self.checks,
            }
        )

    # -- onnxruntime's surface -----------------------------------------------------------

    def get_inputs(self) -> list[NodeArg]:
        return [node_arg(v) for v in self._ports[0]]

    def get_outputs(self) -> list[NodeArg]:
        return [node_arg(v) for v in self._ports[1]]

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, np.ndarray],
        run_options: object = None,
    ) -> list[np.ndarray]:
        """The outputs named in ``output_names`` (None or empty: all, in the model's order)
        for ``input_feed``, a mapping of every input's name to a numpy array. Bad names or
        arrays raise InputError (see :meth:`validate`); ``run_options`` is None or an
        onnxruntime RunOptions, accepted for onnxruntime's sake and not used."""
        names = self._names(output_names)
        if run_options is not None and type(run_options).__name__ != "RunOptions":
            raise ArgumentError(
                f"run_options must be None or an onnxruntime RunOptions, "
                f"given {describe(run_options)}"
            )
        feed = self.validate(input_feed)
        self._last = self._runner(feed)
        results = self._last.run(feed)
        return [results[n] for n in names]

    def _names(self, output_names: object) -> list[str]:
        """``output_names`` checked: None or a list or tuple of the model's output names."""
        known = self._output_names
        if output_names is None:
            return known
        if not isinstance(output_names, list | tuple):
            raise InputError(
                f"output_names must be None or a list of output names (of {known}), "
                f"given {describe(output_names)}"
            )
        if not output_names:
            return known
        unknown = [n for n in output_names if not isinstance(n, str) or n not in known]
        if unknown:
            raise InputError(f"unknown output name(s) {unknown}; the model's outputs are {known}")
        return list(output_names)

    # -- polyonnx ------------------------------------------------------------------------

    @property
    def input_values(self) -> dict[str, Value]:
        """Each input's name, shape and dtype (numpy's name), as the model declares it."""
        return {v.name: v for v in self._ports[0]}

    def compiled_for(self, input_feed: Mapping[str, np.ndarray]) -> CompiledModel:
        """The native code for these input shapes (and values of value inputs), compiled on
        first use and cached; ``input_feed`` is checked as :meth:`run` checks it."""
        return self._specialisation(self.validate(input_feed))

    def runner_for(self, input_feed: Mapping[str, np.ndarray]) -> CompiledModel | Blocked:
        """What runs these inputs: a model run in blocks along its batch (runtime/blocks.py)
        or the native code specialised to their shapes."""
        return self._runner(self.validate(input_feed))

    def _runner(self, feed: Mapping[str, np.ndarray]) -> CompiledModel | Blocked:
        """What runs ``feed``: the model in blocks along its batch where it can be, else
        the specialisation to ``feed``'s shapes."""
        if self._model is None and isinstance(self._parametric, ParametricModel):
            return self._parametric  # a scripted parametric Program
        if self._static or self._model is None or self._value_inputs:
            return self._specialisation(feed)
        shapes = tuple(array.shape for array in feed.values())
        blocked = self._recent.get(shapes)
        if blocked is not None:
            return self._special.get(shapes) or blocked
        symbols = self._symbols()
        if len(symbols) > 1 or not self._batch_only(feed, symbols):
            parametric = self._parametric_for(feed, symbols)
            if parametric is not None:
                return parametric
        for symbol in symbols:
            if not _size_of(self.graph.inputs, feed, symbol):
                continue  # no sample: no block to run
            key = (symbol, resized(self.graph.inputs, feed, symbol, None))
            if key not in self._blocked:
                self._blocked[key] = self._block(feed, symbol)
            blocked = self._blocked[key]
            if blocked is not None and blocked.samples(feed):
                self._remember(shapes, blocked)
                if _size_of(self.graph.inputs, feed, symbol) in self._specialize.get(symbol, ()):
                    self._special.start(feed)
                return blocked
        return self._specialisation(feed)

    def _remember(self, shapes: tuple, runner) -> None:
        """Keep ``runner`` as the runner of feeds of ``shapes`` (at most RECENT of them)."""
        if len(self._recent) >= RECENT:
            self._recent.clear()
        self._recent[shapes] = runner

    def _batch_only(self, feed: Mapping[str, np.ndarray], symbols: list[str]) -> bool:
        """Whether the one symbolic dim is a batch that blocks run (their code is the
        shape-specialised kind, faster than parametric code)."""
        if not symbols or not _size_of(self.graph.inputs, feed, symbols[0]):
            return False
        key = (symbols[0], resized(self.graph.inputs, feed, symbols[0], None))
        if key not in self._blocked:
            self._blocked[key] = self._block(feed, symbols[0])
        return self._blocked[key] is not None

    def _parametric_for(self, feed: Mapping[str, np.ndarray], symbols: list[str]):
        """The parametric model (compiled on first use) as the runner of ``feed``, or
        the background tier's specialisation of its shapes where ``specialize`` asked
        for it and it is ready; None where the model has no parametric program."""
        if self._parametric is False:
            self._parametric = self._compile_parametric(feed, symbols)
        if self._parametric is None or not self._parametric.serves(feed):
            return None
        shapes = tuple(array.shape for array in feed.values())
        self._remember(shapes, self._parametric)
        if any(
            _size_of(self.graph.inputs, feed, s) in self._specialize.get(s, ()) for s in symbols
        ):
            self._special.start(feed)
        return self._special.get(shapes) or self._parametric

    def _compile_parametric(self, feed, symbols: list[str]) -> ParametricModel | None:
        """The model compiled once for every value of ``symbols``; None (and why in
        ``not_parametric``) where it cannot be."""
        if self.profiling:
            self.not_parametric = "a profiled session compiles per shape (kernel_profile)"
            return None
        at = graph_at(self.graph.inputs, partial(self._specialised, feed, merge=False))
        point = {s: _size_of(self.graph.inputs, feed, s) for s in symbols}
        try:
            model = compile_parametric(symbols, at, self._target, checks=self.checks,
                                       records=self.records, point=point)  # fmt: skip
        except PolyonnxError as exc:
            self.not_parametric = str(exc)
            return None
        self.compile_count += 1
        model.set_threads(self.threads)
        return model

    def _symbols(self) -> list[str]:
        """The symbolic input dims, those that lead an input first."""
        dims = [(axis > 0, d) for v in self.graph.inputs for axis, d in enumerate(v.shape)]
        dims.sort(key=lambda pair: pair[0])
        return list(dict.fromkeys(d for _, d in dims if isinstance(d, str)))

    def _block(self, feed: Mapping[str, np.ndarray], symbol: str) -> Blocked | None:
        """The model compiled for one sample along ``symbol``, run in blocks; None (and
        why in ``not_blocked``) where the graph mixes samples along it."""
        shapes = {name: array.shape for name, array in feed.items()}
        plan = plan_along(
            symbol, self.graph.inputs, shapes, partial(self._specialised, feed, merge=False)
        )
        if isinstance(plan, str):
            self.not_blocked[symbol] = plan
            return None
        model = self._specialisation(first_block(plan, feed))
        if self._value_inputs:
            self.not_blocked[symbol] = "lowering needs the values of inputs"
            return None
        laid_out = model.abi.input_offsets if isinstance(model, CompiledModel) else {}
        return Blocked(plan, model, frozenset(laid_out))

    def _compile_special(self, feed: Mapping[str, np.ndarray]) -> CompiledModel:
        """The specialisation of ``feed``'s shapes, for the background tier (not kept in
        ``_compiled``, which runs read)."""
        return self._compile(None, feed)

    def wait_for_specializations(self, timeout: float | None = None) -> bool:
        """Wait for the background compiles of ``specialize`` started so far; whether all
        have finished. Runs never need to: they go on in blocks meanwhile."""
        return self._special.wait(timeout)

    def _specialisation(self, feed: Mapping[str, np.ndarray]) -> CompiledModel:
        """:meth:`compiled_for` of a feed :meth:`validate` returned."""
        key = self._key(feed)
        while key not in self._compiled:
            try:
                self._keep(feed, self._compile(None, feed))
                key = self._key(feed)
            except ValueRequiredError as exc:
                if set(exc.inputs) <= set(self._value_inputs):
                    raise
                self._value_inputs += [n for n in exc.inputs if n not in self._value_inputs]
                key = self._key(feed)
        return self._compiled[key]

    def kernel_profile(
        self, input_feed: Mapping[str, np.ndarray] | None = None
    ) -> list[KernelProfile]:
        """Per kernel, in execution order: kernel name, op type, seconds summed over its
        calls, calls, and share of the model's kernel time, since the first run or the last
        :meth:`reset_profile`. Models compiled per input shape keep one profile per shape:
        this is the one of ``input_feed``'s shapes, or without it, of the last run."""
        if not self.profiling:
            raise PolyonnxError(
                "this session does not profile; create it with InferenceSession(..., profile=True)"
            )
        if input_feed is not None:
            return self.runner_for(input_feed).kernel_profile()
        compiled = self._last or next(iter(self._compiled.values()), None)
        if compiled is None:
            raise PolyonnxError("nothing has been compiled yet: run the session first")
        return compiled.kernel_profile()

    def reset_profile(self) -> None:
        """Zero the time and call count of every kernel of every compiled shape."""
        if not self.profiling:
            raise PolyonnxError("this session does not profile; create it with profile=True")
        for compiled in self._compiled.values():
            compiled.reset_profile()

    def _key(self, feed: Mapping[str, np.ndarray], offsets: Mapping[str, int] | None = None):
        """The specialisation for ``feed``: its shapes and value inputs' values, and where
        the offset inputs' data starts (``offsets``, else read off ``feed``)."""
        if not feed or (self._static and not self._value_inputs):
            key: tuple = ("static",)
        else:
            shapes = tuple((name, tuple(arr.shape)) for name, arr in sorted(feed.items()))
            values = tuple((n, feed[n].dtype.str, feed[n].tobytes()) for n in self._value_inputs)
            key = (shapes, values)
        if not self._offset_inputs:
            return key
        offsets = self._offsets(feed) if offsets is None else offsets
        return (*key, tuple(offsets.get(n) for n in self._offset_inputs))

    def _offsets(self, feed: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Where the offset inputs' data starts past a cache line in ``feed``, in bytes."""
        return {n: feed[n].ctypes.data % ALIGN for n in self._offset_inputs if n in feed}

    def _keep(self, feed: Mapping[str, np.ndarray], compiled: CompiledModel) -> None:
        """Cache ``compiled`` as the specialisation of ``feed``'s shapes (and values) and
        of the input offsets its code is laid out for."""
        laid_out = dict(compiled.abi.input_offsets) if isinstance(compiled, CompiledModel) else {}
        self._offset_inputs += [n for n in laid_out if n not in self._offset_inputs]
        self._compiled[self._key(feed, laid_out)] = compiled

    def _expected(self) -> dict[str, tuple[Value, np.dtype, tuple | None]]:
        """Each input's description, numpy dtype and shape if it has no symbolic dims
        (worked out once: a small model's run is a few microseconds of native code)."""
        if self._inputs is None:
            self._inputs = {
                v.name: (v, np.dtype(v.dtype), tuple(v.shape) if v.is_static else None)
                for v in self._ports[0]
            }
        return self._inputs

    @cached_property
    def _output_names(self) -> list[str]:
        return [v.name for v in self._ports[1]]

    def validate(self, input_feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Check every input against the model; return C-contiguous arrays in native byte
        order (wherever their data starts: krnl/ops/matmul.py's INPUT_OFFSET). ``input_feed``
        maps every input's name (a str) to a numpy array (numpy scalars count as rank-0
        arrays). Anything else is refused with InputError: lists too, which onnxruntime
        converts to the input's dtype silently (1.7 becomes 1 in an int64 input). A
        non-native byte order is converted (onnxruntime reads the bytes as native: wrong
        values)."""
        if type(input_feed) is not dict and not isinstance(input_feed, Mapping):
            raise InputError(
                f"input_feed must be a dict of input name -> numpy array (inputs "
                f"{list(self._expected())}), given {describe(input_feed)}"
            )
        expected = self._expected()
        if len(input_feed) == len(expected):  # the usual case, checked in a few ns an input
            feed, symbolic = {}, False
            for name, (_, dtype, static) in expected.items():
                given = input_feed.get(name)
                symbolic = symbolic or static is None
                if not (
                    type(given) is np.ndarray
                    and given.dtype == dtype
                    and (given.shape == static or static is None)
                    and given.flags.c_contiguous
                ):
                    break
                feed[name] = given
            else:
                if not symbolic or tuple(a.shape for a in feed.values()) in self._valid_shapes:
                    return feed
        _check_names(input_feed, list(expected))
        feed: dict[str, np.ndarray] = {}
        symbols: dict[str, tuple[str, int]] = {}
        for name, (value, dtype, static) in expected.items():
            given = _array(name, input_feed[name], value.dtype, dtype)
            if given.shape != static:
                _check_shape(name, value.shape, given.shape, symbols)
            feed[name] = given if given.flags.c_contiguous else np.ascontiguousarray(given)
        if len(self._valid_shapes) >= RECENT:
            self._valid_shapes.clear()
        self._valid_shapes.add(tuple(a.shape for a in feed.values()))
        return feed


def _size_of(inputs: Sequence[Value], feed: Mapping, symbol: str) -> int:
    """The size ``feed`` gives ``symbol`` (validated: the same in every input)."""
    for v in inputs:
        for d, n in zip(v.shape, feed[v.name].shape, strict=True):
            if d == symbol:
                return n
    return 0


def _check_names(input_feed: Mapping, expected: list[str]) -> None:
    """Every key a str naming an input, and every input given: InputError naming all that
    is wrong, not just the first."""
    keys = list(input_feed)
    odd = [k for k in keys if not isinstance(k, str)]
    if odd:
        raise InputError(
            f"input names must be str, given {', '.join(describe(k) for k in odd[:5])}; "
            f"the model's inputs are {expected}"
        )
    unknown = [k for k in keys if k not in expected]
    missing = [n for n in expected if n not in input_feed]
    problems = [f"unknown input name(s) {unknown}"] if unknown else []
    problems += [f"missing input(s) {missing}"] if missing else []
    if problems:
        raise InputError(f"{' and '.join(problems)}; the model's inputs are {expected}")


def _array(name: str, given: object, declared: str, dtype: np.dtype) -> np.ndarray:
    """``given`` as an ndarray of ``dtype`` in native byte order, or InputError."""
    if not isinstance(given, np.ndarray | np.generic):
        raise InputError(
            f"input {name!r}: expected a numpy.ndarray of {declared} (np.asarray(value, "
            f"np.{declared}) makes one), given {describe(given)}"
        )
    given = np.asarray(given)
    if given.dtype == dtype:
        return given
    if not given.dtype.isnative and given.dtype.newbyteorder("=") == dtype:
        return given.astype(dtype)  # the same values, in the byte order native code reads
    raise InputError(f"input {name!r}: expected dtype {declared}, given {given.dtype.name}")


def _checked_target(target: object) -> Target | None:
    if target is not None and not isinstance(target, Target):
        raise ArgumentError(
            "target must be a polyonnx.target.Target (polyonnx.target.make_target(triple, "
            f"cpu)) or None for the host, given {describe(target)}"
        )
    return target


def _checked_limits(limits: object) -> Limits | None:
    if limits is not None and not isinstance(limits, Limits):
        raise ArgumentError(
            "limits must be a polyonnx.frontend.limits.Limits (docs/limits.md) or None, "
            f"given {describe(limits)}"
        )
    return limits


def _checked_records(records: object) -> ScheduleRecords | None:
    if records is not None and not all(
        callable(getattr(records, name, None)) for name in ("schedules", "fingerprint")
    ):
        raise ArgumentError(
            f"records must be tuning records (tune/apply.py's Records) or None, "
            f"given {describe(records)}"
        )
    return records


def _scripted_parametric(program, target: Target | None, checks: bool) -> ParametricModel:
    """A ParametricProgram (polyonnx/program.py) under its scripted schedules, compiled."""
    target = target or host_target()
    build = plan_parametric(program.fitted, program.compilable()[1], target, checks=checks)
    return jit_parametric(build, target, checks)


def _is_program(model: object) -> bool:
    from polyonnx.program import Program

    return isinstance(model, Program)


def _check_shape(name: str, shape: tuple[Dim, ...], given: tuple[int, ...], symbols: dict) -> None:
    if len(shape) != len(given):
        raise InputError(
            f"input {name!r}: expected rank {len(shape)} (shape {list(shape)}), "
            f"given rank {len(given)} (shape {list(given)})"
        )
    for axis, (want, got) in enumerate(zip(shape, given, strict=True)):
        if isinstance(want, int):
            if want != got:
                raise InputError(
                    f"input {name!r}: expected shape {list(shape)}, given {list(given)} "
                    f"(dim {axis} must be {want}, is {got})"
                )
            continue
        if want in symbols and symbols[want][1] != got and not want.startswith("?"):
            other, size = symbols[want]
            raise InputError(
                f"input {name!r}: dim {axis} is the symbolic size {want!r}, which input "
                f"{other!r} gave as {size}; here it is {got}"
            )
        symbols.setdefault(want, (name, got))
