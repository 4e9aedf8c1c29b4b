"""Compiled models as shared libraries: written by ``polyonnx compile``, loaded back here.

``compile_library`` runs the JIT's pipeline (same schedules, same tuning records) for a
target and writes ``libNAME.so`` and ``NAME.h`` (emit/aot.py). ``LibraryModel`` opens such
a library through its C API with ctypes: no compiling, no llvmlite or islpy at run time,
the library's own checks before native code runs.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np

from polyonnx.aligned import aligned_empty
from polyonnx.emit.abi import ONNX_TYPES, EntryAbi, Port
from polyonnx.emit.aot import Library, NativeModel, Root, Sizes, write_library
from polyonnx.errors import InputError, ModelError, RunError
from polyonnx.krnl.params import TIMES, NotParametric, Poly, program_symbols
from polyonnx.runtime.blocks import BatchOf, batch_of
from polyonnx.runtime.compiled import (
    check_table,
    emit_program,
    entry_ports,
    lower_model,
    model_schedules,
)
from polyonnx.runtime.memory import lifetimes
from polyonnx.runtime.parametric import (
    ParametricBuild,
    entry_parameters,
    fit_parametric,
    graph_at,
    plan_parametric,
    symbol_of,
)
from polyonnx.schedule.heuristics.panels import panel_only
from polyonnx.target import Target, host_target

DTYPES = {number: name for name, number in ONNX_TYPES.items()}
ERROR_RUN = 5
"""NAME_run's status for a bad value met at run time (POLYONNX_ERROR_RUN, capi/header.h)."""
LIBRARY_NAME = re.compile(r"lib([A-Za-z_][A-Za-z0-9_]*)\.so\Z")


def compile_library(
    model,
    directory: str | os.PathLike,
    name: str,
    *,
    target: Target | None = None,
    records=None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    default_threads: int = 0,
    checks: bool = True,
) -> Library:
    """Compile ``model`` for ``target`` (the host by default) into DIR/libNAME.so and
    DIR/NAME.h. ``records`` (tune/apply.py's Records) schedule their kernels on the host,
    as they do for the JIT. ``default_threads``: what NAME_open(0) takes (0: a thread per
    online core). ``checks``: run-time checks of indices and integer divisors
    (runtime/compiled.py's compile_program). Symbolic dims that ``input_shapes`` leaves
    run in blocks where the one left is a batch, else as isl parameters of one
    parametric entry (:func:`parametric_library`)."""
    found = batch_of(model, input_shapes)
    if found.symbols and found.plan is None:
        return parametric_library(
            model, found, directory, name, target=target, default_threads=default_threads,
            checks=checks,
        )  # fmt: skip
    shapes = found.one_sample if found.plan is not None else input_shapes
    program = lower_model(model, shapes)
    host = target is None or target == host_target()
    schedules, _ = model_schedules(program, None if host else target, records)
    target = target or host_target()
    native = emit_program(program, schedules, target, profile=False, checks=checks)
    return write_library(native.model, target, directory, name, default_threads, batch=found.plan)


def parametric_library(
    model,
    found: BatchOf,
    directory: str | os.PathLike,
    name: str,
    *,
    target: Target | None = None,
    default_threads: int = 0,
    checks: bool = True,
) -> Library:
    """The library of one entry for every value of ``found.symbols`` (runtime/parametric.py);
    InputError, saying why, where the model is not parametric or a library cannot size
    it (a constant refolded per size, a dim of degree more than two)."""
    from polyonnx.frontend.load import load_graph
    from polyonnx.krnl.lower import supported_ops

    def load(shapes):
        return load_graph(model, merge=False, supported_ops=supported_ops(), input_shapes=shapes)

    if target is not None and target != host_target():
        _refuse(found, "a parametric library is built for the host only")
    target = host_target()
    try:
        fitted = fit_parametric(found.symbols, graph_at(found.graph.inputs, load))
        if fitted.derived.names:
            raise NotParametric(f"constants depend on the sizes: {list(fitted.derived.names)}")
        build = plan_parametric(fitted, fitted.default_schedules(), target, checks=checks)
        native, sizes = parametric_native(build, checks)
    except NotParametric as exc:
        _refuse(found, f"not parametric: {exc}")
    return write_library(native, target, directory, name, default_threads, sizes=sizes)


def _refuse(found: BatchOf, why: str) -> NoReturn:
    dynamic = {v.name: list(v.shape) for v in found.graph.inputs if not v.is_static}
    raise InputError(
        f"inputs with symbolic dims need concrete shapes (--shape NAME=D0,D1,...): {dynamic} "
        f"({'; '.join(w for w in (found.why, why) if w)})"
    )


def parametric_native(build: ParametricBuild, checks: bool) -> tuple[NativeModel, Sizes]:
    """What ``write_library`` builds a parametric library from: the modules, the entry's
    slots (the parameters slot where the arena's would be) and the tensors' sizes."""
    program, slots = build.program, build.slots
    symbols = program_symbols(program)
    index = {symbol: k for k, symbol in enumerate(symbols)}
    aliases = panel_only(program, build.schedules)

    inputs, outputs = entry_ports(program, {n: i for i, n in enumerate(slots.external)})
    abi = EntryAbi(
        inputs=inputs,
        outputs=outputs,
        constant_slots=tuple(
            (i, aliases.get(n, n)) for i, n in enumerate(slots.external) if n in program.constants
        ),
        arena_slot=slots.params,
        arena_bytes=0,
        kernels=(),
        checks=check_table(build.schedules) if checks else (),
    )
    used = {n for _, n in abi.constant_slots} | {p.copy_of for p in abi.outputs}
    constants = {n: program.constants[n] for n in used if n in program.constants}
    native = NativeModel(build.plan, program.buffers, abi, constants)
    return native, _sizes(program, slots, symbols, index, build.schedules)


def _sizes(program, slots, symbols, index, schedules) -> Sizes:
    def dims(name: str) -> tuple:
        return tuple(_terms(d, index) for d in program.buffers[name].shape)

    first, last = lifetimes(program, set(slots.roots))
    roots = tuple(
        Root(dims(r), program.buffers[r].itemsize, first[r], last[r]) for r in slots.roots
    )
    shown = [
        f"{kind} {n!r}: [{', '.join(str(d) for d in program.buffers[n].shape)}]"
        for kind, names in (("input", program.inputs), ("output", program.outputs))
        for n in names
    ]
    return Sizes(
        symbols=symbols,
        parameters=tuple(_parameter(p, index) for p in entry_parameters(schedules)),
        input_symbols=tuple(
            tuple(_input_symbol(d, index, n) for d in program.buffers[n].shape)
            for n in program.inputs
        ),
        inputs=tuple(dims(n) for n in program.inputs),
        outputs=tuple(dims(n) for n in program.outputs),
        roots=roots,
        roots_slot=len(slots.external),
        params_slot=slots.params,
        text="\n".join(shown),
    )


def _terms(dim, index: Mapping[str, int]) -> tuple[tuple[int, int, int], ...]:
    """``dim`` (an int or a Poly) as aot.py's Terms; NotParametric past degree two."""
    poly = Poly.of(dim)
    terms = []
    for mono, coeff in poly.terms:
        names = [index[n] for n, power in mono for _ in range(power)]
        if len(names) > 2:
            raise NotParametric(f"the dim {poly} is of degree {len(names)}; a library sizes to 2")
        names += [-1] * (2 - len(names))
        terms.append((coeff, names[0], names[1]))
    return tuple(terms)


def _input_symbol(dim, index: Mapping[str, int], name: str) -> int:
    if isinstance(dim, int):
        return -1
    symbol = symbol_of(dim)
    if symbol is None:
        raise NotParametric(f"input {name!r} has the dim {dim}, not a symbol alone")
    return index[symbol]


def _parameter(name: str, index: Mapping[str, int]) -> tuple[int, int]:
    """The symbols whose product the isl parameter ``name`` is (``S``, ``N_x_S``)."""
    parts = [index[p] for p in name.split(TIMES)]
    return (parts[0], parts[1] if len(parts) > 1 else -1)


def default_name(model) -> str:
    """A library name from the model's file name: a C identifier."""
    stem = Path(os.fspath(model)).stem if isinstance(model, str | os.PathLike) else "model"
    name = re.sub(r"\W", "_", stem, flags=re.ASCII)
    return name if re.match(r"[A-Za-z_]", name) else f"m_{name}"


def library_name(path: str | os.PathLike) -> str:
    """NAME of a path ``.../libNAME.so``."""
    match = LIBRARY_NAME.match(Path(path).name)
    if not match:
        raise ModelError(f"{os.fspath(path)!r} is not named libNAME.so, as polyonnx compile names")
    return match.group(1)


def is_library(model: object) -> bool:
    """Whether ``model`` is a path to a shared library (ELF), not an ONNX file."""
    if not isinstance(model, str | os.PathLike):
        return False
    path = Path(model)
    if path.suffix != ".so" or not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


class LibraryModel:
    """A library written by ``polyonnx compile``, opened with ``threads`` threads."""

    def __init__(self, path: str | os.PathLike, threads: int, name: str | None = None):
        self.path = Path(path).resolve()
        self.name = name or library_name(path)
        try:
            self._lib = ctypes.CDLL(str(self.path), mode=os.RTLD_LOCAL)
            self._fn = {f: getattr(self._lib, f"{self.name}_{f}") for f in _SIGNATURES}
        except (OSError, AttributeError) as exc:
            message = f"cannot load {str(self.path)!r} as a polyonnx library: {exc}"
            raise ModelError(message) from exc
        for fn in _BATCH_SIGNATURES:  # libraries before batches lack them
            found = getattr(self._lib, f"{self.name}_{fn}", None)
            if found is not None:
                self._fn[fn] = found
        for fn, (restype, argtypes) in {**_SIGNATURES, **_BATCH_SIGNATURES}.items():
            if fn in self._fn:
                self._fn[fn].restype, self._fn[fn].argtypes = restype, argtypes
        symbol = self._fn["batch_name"]() if "batch_name" in self._fn else None
        self.batch: str | None = None if symbol is None else symbol.decode()
        """The symbolic dim of any size (-1 in the library's dims), or None."""
        count = self._fn["symbol_count"]() if "symbol_count" in self._fn else 0
        self.symbols: tuple[str, ...] = tuple(
            self._fn["symbol_name"](k).decode() for k in range(count)
        )
        """The symbolic dims (the batch alone, for a library of a batch)."""
        self.inputs = tuple(self._port("input", i) for i in range(self._fn["input_count"]()))
        self.outputs = tuple(self._port("output", i) for i in range(self._fn["output_count"]()))
        self._session = self._fn["open"](max(int(threads), 1))
        if not self._session:
            raise ModelError(f"{self.name}_open failed: {self._fn['error'](None).decode()}")
        self._inputs = (ctypes.c_void_p * len(self.inputs))()
        self._dims = (ctypes.POINTER(ctypes.c_int64) * len(self.inputs))()
        self._given: list = [None] * len(self.inputs)
        """Dims of inputs not of their declared shape, kept alive while they are passed."""
        self._outputs = (ctypes.c_void_p * len(self.outputs))()
        self._bytes = (ctypes.c_size_t * len(self.outputs))()
        self.tuned: tuple[str, ...] = ()

    def _port(self, kind: str, i: int) -> Port:
        rank = self._fn[f"{kind}_rank"](i)
        dims = self._fn[f"{kind}_dims"](i)
        dtype = DTYPES[self._fn[f"{kind}_type"](i)]
        name = self._fn[f"{kind}_name"](i).decode()
        shape = tuple(int(dims[d]) for d in range(rank))
        if -1 in shape and self.batch is None:  # parametric: the symbols by name
            named = [self._symbol(kind, i, d) for d in range(rank)]
            shape = tuple(n if s == -1 else s for n, s in zip(named, shape, strict=True))
        elif -1 in shape:
            one = kind == "input" or self._one_row(i, rank)
            symbol = self.batch if one else f"?{self.batch}"
            shape = tuple(symbol if d == -1 else d for d in shape)
        return Port(name, dtype, shape, i)

    def _symbol(self, kind: str, i: int, d: int) -> str:
        """The name of dim ``d`` of an input; of an output, made up (``?`` and a number)."""
        if kind == "input":
            return self.symbols[self._fn["input_symbol"](i, d)]
        return f"?{i}.{d}"

    def _one_row(self, i: int, rank: int) -> bool:
        """Whether output ``i`` has one row a sample on its batch's axis (its extent is the
        batch's size; else its dim is unnamed, as a made-up ``?`` name)."""
        dims = (ctypes.c_int64 * max(rank, 1))()
        self._fn["output_dims_for"](i, 1, dims)
        declared = self._fn["output_dims"](i)
        return all(dims[d] == 1 for d in range(rank) if declared[d] == -1)

    def memory(self):
        """Not reported by a library's API."""
        return None

    def samples(self, inputs: Mapping[str, np.ndarray]) -> int:
        """The batch size ``inputs`` give (1 for a library of no batch); the library checks
        that every input gives the same."""
        for port in self.inputs:
            if self.batch in port.shape:
                return inputs[port.name].shape[port.shape.index(self.batch)]
        return 1

    def output_shape(self, port: Port, samples: int, values=None) -> tuple[int, ...]:
        """The shape of output ``port`` for a batch of ``samples``, or for the symbols'
        ``values`` (a parametric library)."""
        if all(isinstance(d, int) for d in port.shape):
            return port.shape
        dims = (ctypes.c_int64 * max(len(port.shape), 1))()
        if values is not None:
            code = self._fn["output_dims_at"](port.slot, values, dims)
        else:
            code = self._fn["output_dims_for"](port.slot, samples, dims)
        if code:
            raise InputError(f"{self.name}: output {port.name!r} has no dims for these inputs")
        return tuple(dims[d] for d in range(len(port.shape)))

    def _values(self, inputs: Mapping[str, np.ndarray]):
        """The symbols' values ``inputs`` give, the first input to give each (the library
        checks that every input agrees); None for a library of a batch or none."""
        if self.batch is not None or not self.symbols:
            return None
        values = (ctypes.c_int64 * len(self.symbols))(*([1] * len(self.symbols)))
        for port in reversed(self.inputs):
            for d, dim in enumerate(port.shape):
                if isinstance(dim, str):
                    values[self.symbols.index(dim)] = max(inputs[port.name].shape[d], 1)
        return values

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inputs must be C-contiguous arrays; the library checks their dims again."""
        samples = self.samples(inputs)
        values = self._values(inputs)
        for i, port in enumerate(self.inputs):
            array = inputs[port.name]
            self._inputs[i] = array.ctypes.data
            if array.shape != port.shape:  # the library's own dims pointer, else these
                self._given[i] = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
                self._dims[i] = ctypes.cast(self._given[i], ctypes.POINTER(ctypes.c_int64))
            else:
                self._dims[i] = self._fn["input_dims"](i)
        results = {}
        for i, port in enumerate(self.outputs):
            array = results.get(port.name)
            if array is None:
                shape = self.output_shape(port, samples, values)
                array = results[port.name] = aligned_empty(shape, port.dtype)
            self._outputs[i] = array.ctypes.data
            self._bytes[i] = array.nbytes
        code = self._fn["run"](self._session, self._inputs, self._dims, self._outputs, self._bytes)
        if code:
            message = self._fn["error"](self._session).decode(errors="replace")
            if code == ERROR_RUN:
                raise RunError(message)
            raise InputError(f"{self.name}_run: {message}")
        return results

    def close(self) -> None:
        if getattr(self, "_session", None):
            self._fn["close"](self._session)
            self._session = None

    def __del__(self) -> None:
        self.close()


_P = ctypes.c_void_p
_SIGNATURES = {
    "open": (_P, [ctypes.c_int]),
    "close": (None, [_P]),
    "error": (ctypes.c_char_p, [_P]),
    "input_count": (ctypes.c_int, []),
    "output_count": (ctypes.c_int, []),
    "input_name": (ctypes.c_char_p, [ctypes.c_int]),
    "output_name": (ctypes.c_char_p, [ctypes.c_int]),
    "input_type": (ctypes.c_int, [ctypes.c_int]),
    "output_type": (ctypes.c_int, [ctypes.c_int]),
    "input_rank": (ctypes.c_int, [ctypes.c_int]),
    "output_rank": (ctypes.c_int, [ctypes.c_int]),
    "input_dims": (ctypes.POINTER(ctypes.c_int64), [ctypes.c_int]),
    "output_dims": (ctypes.POINTER(ctypes.c_int64), [ctypes.c_int]),
    "run": (ctypes.c_int, [_P, _P, _P, _P, _P]),
    "run_output_dims": (ctypes.c_int, [_P, ctypes.c_int, _P]),
}
"""The C API's functions (without the NAME_ prefix): return type and argument types."""
_BATCH_SIGNATURES = {
    "batch_name": (ctypes.c_char_p, []),
    "output_dims_for": (ctypes.c_int, [ctypes.c_int, ctypes.c_int64, ctypes.c_void_p]),
    "symbol_count": (ctypes.c_int, []),
    "symbol_name": (ctypes.c_char_p, [ctypes.c_int]),
    "input_symbol": (ctypes.c_int, [ctypes.c_int, ctypes.c_int]),
    "output_dims_at": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
}
"""The functions of batches and symbols, which older libraries lack."""
