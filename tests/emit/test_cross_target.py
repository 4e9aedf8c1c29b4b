"""Targets other than the host: their descriptions (polyonnx/target.py's make_target), their
default GEMM register tiles, and models compiled for them down to ELF objects of the
right machine. aarch64 code cannot run here; its 8 x 12 NEON tile is run on the host
instead, in 4-lane vectors."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from onnx import helper

from polyonnx.emit.module import emit_module
from polyonnx.emit.pool import pool_module
from polyonnx.errors import PolyonnxError, TargetError
from polyonnx.frontend.load import load_graph
from polyonnx.krnl.lower import lower, supported_ops
from polyonnx.krnl.verify import check_bounds
from polyonnx.runtime.compiled import compile_program, optimize
from polyonnx.runtime.memory import plan_memory
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.heuristics.panels import pack_constants
from polyonnx.target import Target, host_target, make_target
from tests.helpers import make_model, random_array, sum_tol, value_info

F32 = np.float32
MLP = pathlib.Path(__file__).parents[2] / "examples" / "mlp.onnx"
E_MACHINE = {"aarch64": 183, "x86_64": 62}
"""ELF e_machine: EM_AARCH64, EM_X86_64."""


@pytest.mark.parametrize(
    ("triple", "cpu", "name", "lanes", "registers", "has", "lacks"),
    [
        ("aarch64-linux-gnu", "neoverse-n1", "neoverse-n1", 4, 32, {"neon"}, set()),
        ("aarch64-linux-gnu", "cortex-a72", "cortex-a72", 4, 32, {"neon"}, set()),
        ("aarch64-linux-gnu", None, "generic", 4, 32, {"neon"}, set()),
        ("x86_64-linux-gnu", "haswell", "haswell", 8, 16, {"avx2", "fma"}, {"avx512f"}),
        ("x86_64-linux-gnu", "x86-64", "x86-64", 4, 16, set(), {"avx", "fma"}),
        ("x86_64-linux-gnu", None, "x86-64", 4, 16, set(), {"avx"}),
        ("x86_64-unknown-linux-gnu", "znver4", "znver4", 16, 32, {"avx512f", "fma"}, set()),
        ("x86_64-linux-gnu", "skylake-avx512", "skylake-avx512", 16, 32, {"avx512f"}, set()),
    ],
)
def test_target_description(triple, cpu, name, lanes, registers, has, lacks):
    target = make_target(triple, cpu)
    enabled = {f[1:] for f in target.features.split(",") if f.startswith("+")}
    assert (target.triple, target.name) == (triple, name)
    assert (target.lanes(4), target.vector_registers) == (lanes, registers)
    assert has <= enabled and not lacks & enabled


def test_no_triple_and_no_cpu_is_the_host():
    assert make_target() is host_target()
    assert make_target(cpu="native") == host_target()


def test_a_copy_without_avx512_has_16_registers():
    """The register count follows the features, so emit tests' AVX2 copies of an AVX-512
    host (dataclasses.replace) schedule for 16 registers."""
    target = make_target("x86_64-linux-gnu", "znver4")
    features = target.features.replace("+avx512f", "-avx512f")
    assert dataclasses.replace(target, features=features).vector_registers == 16


@pytest.mark.parametrize(
    ("triple", "cpu", "says"),
    [
        ("riscv64-linux-gnu", None, "x86_64 and aarch64"),
        ("aarch64-apple-darwin", None, "Linux triple"),
        ("aarch64-linux-gnu", "neoverse-n9", "not an LLVM aarch64 CPU"),
        ("x86_64-linux-gnu", "haswel", "did you mean haswell"),
        ("x86_64-linux-gnu", "cortex-a72", "it is an aarch64 CPU"),
        ("aarch64-linux-gnu", "haswell", "it is an x86_64 CPU"),
    ],
)
def test_unknown_triple_or_cpu_raises_target_error(triple, cpu, says):
    with pytest.raises(TargetError, match=says) as info:
        make_target(triple, cpu)
    assert isinstance(info.value, PolyonnxError)


def test_native_cpu_of_another_architecture_raises():
    other = "aarch64" if host_target().arch == "x86_64" else "x86_64"
    with pytest.raises(TargetError, match="name its CPU"):
        make_target(f"{other}-linux-gnu", "native")


# ---- default GEMM tiles ------------------------------------------------------------


def _tile(lanes: int, registers: int, m=64, k=256, n=96) -> tuple[int, int]:
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    model = make_model(
        [node],
        [value_info("a", F32, (m, k)), value_info("b", F32, (k, n))],
        [value_info("y", F32, (m, n))],
    )
    program = _program(model)
    tree = default_schedule(program.kernels[0], program.buffers, lanes, registers).tree
    mr, nr = re.search(r"ukernel_mr(\d+)_nr(\d+)", tree).groups()
    return int(mr), int(nr)


def test_neon_gemm_tile_fits_32_registers():
    """8 x 12: 24 accumulators, 3 vectors of B and a broadcast of A, in 32 registers of
    4 lanes (the x86 default for 4 lanes, SSE's 16 registers, stays 6 x 8)."""
    target = make_target("aarch64-linux-gnu", "neoverse-n1")
    lanes, registers = target.lanes(4), target.vector_registers
    mr, nr = _tile(lanes, registers)
    assert (mr, nr) == (8, 12)
    assert mr * nr // lanes + nr // lanes + 1 <= registers
    assert _tile(4, 16) == (6, 8)


def test_x86_gemm_tiles_are_unchanged():
    """lanes alone still mean x86's registers of that width: AVX-512 8 x 32, AVX2 6 x 16."""
    assert _tile(16, 32) == _tile(16, None) == (8, 32)
    assert _tile(8, 16) == _tile(8, None) == (6, 16)


def test_neon_tile_runs_correctly_in_4_lane_vectors_on_the_host():
    """The aarch64 schedules (4 lanes, 32 registers: 8 x 12 tiles, a 3x3 Conv read in
    place with 3 vectors a tile) compiled for the host in 128-bit vectors."""
    rng = np.random.default_rng(0)
    m, k, n = 37, 150, 53
    a, b = random_array(rng, (m, k)), random_array(rng, (k, n))
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    model = make_model(
        [node],
        [value_info("a", F32, (m, k)), value_info("b", F32, (k, n))],
        [value_info("y", F32, (m, n))],
    )
    got = _run_neon_shaped(model, {"a": a, "b": b})["y"]
    np.testing.assert_allclose(got, a @ b, **sum_tol(4 * k))
    x = random_array(rng, (1, 8, 19, 19))
    cnn = _small_cnn(rng)
    got = _run_neon_shaped(cnn, {"x": x})["y"]
    np.testing.assert_allclose(got, _small_cnn_reference(cnn, x), rtol=1e-4, atol=1e-5)


def _run_neon_shaped(model, feed):
    host = dataclasses.replace(host_target(), vector_bits=128)
    program = _program(model)
    schedules = [default_schedule(kr, program.buffers, 4, 32) for kr in program.kernels]
    assert any("ukernel_mr8_nr12" in s.tree for s in schedules)
    return compile_program(program, schedules, host).run(feed)


# ---- object files ------------------------------------------------------------------

TARGETS = [
    ("aarch64-linux-gnu", "neoverse-n1"),
    ("aarch64-linux-gnu", "cortex-a72"),
    ("x86_64-linux-gnu", "haswell"),
    ("x86_64-linux-gnu", "x86-64"),
]


@pytest.mark.parametrize(("triple", "cpu"), TARGETS)
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_model_compiles_to_an_object_for_the_target(triple, cpu, model):
    target = make_target(triple, cpu)
    source = str(MLP) if model == "mlp" else _small_cnn(np.random.default_rng(1))
    program = _program(source)
    schedules = [
        default_schedule(kr, program.buffers, target.lanes(4), target.vector_registers)
        for kr in program.kernels
    ]
    obj = _object(_module(program, schedules, target), target)
    assert obj[:4] == b"\x7fELF"
    assert int.from_bytes(obj[18:20], "little") == E_MACHINE[target.arch]
    if target.arch == "aarch64":
        assert not any("ukernel" in s.tree and "_nr12_" not in s.tree for s in schedules)


@pytest.mark.parametrize(("triple", "cpu"), [TARGETS[1], TARGETS[3]])
def test_worker_pool_compiles_for_the_target(triple, cpu):
    target = make_target(triple, cpu)
    for placement in (False, True):
        module = pool_module(target.triple, placement)
        assert int.from_bytes(_object(module, target)[18:20], "little") == E_MACHINE[target.arch]
    spin = "yield" if target.arch == "aarch64" else "pause"
    assert spin in _machine(target).emit_assembly(llvm.parse_assembly(str(module)))


def test_no_fma_instruction_means_no_libm_calls_in_the_gemm():
    """x86-64's baseline has no FMA: the micro-kernel multiplies and adds (llvm.fmuladd)
    rather than calling libm's fmaf for every lane."""
    target = make_target("x86_64-linux-gnu", "x86-64")
    program = _program(str(MLP))
    schedules = [default_schedule(kr, program.buffers, 4, 16) for kr in program.kernels]
    functions = str(_module(program, schedules, target)).split("\ndefine ")
    gemms = "".join(f for f in functions if ".gemm" in f.split("(", 1)[0])
    assert "llvm.fmuladd.v4f32" in gemms and "llvm.fma." not in gemms


# ---- helpers -----------------------------------------------------------------------


def _program(model):
    return optimize(lower(load_graph(model, supported_ops=supported_ops())))


def _module(program, schedules, target: Target):
    """runtime/compiled.py's compile_program up to the module: constant weights packed,
    bounds checked, memory planned."""
    program, schedules = pack_constants(program, tuple(schedules))
    check_bounds(program)
    layout = plan_memory(program)
    places = {name: (p.slot, p.offset) for name, p in layout.places.items()}
    return emit_module(schedules, program.buffers, places, target)[0]


def _machine(target: Target) -> llvm.TargetMachine:
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.name, features=target.features, opt=2, reloc="pic"
    )


def _object(module, target: Target) -> bytes:
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    return _machine(target).emit_object(parsed)


def _small_cnn(rng: np.random.Generator):
    """3x3 "same" Conv (read in place) + Relu, 2x2 MaxPool, 1x1 Conv + Sigmoid, global
    average pool, Gemm and Softmax: the GEMM, taps, pool and vector-math code paths."""
    w1 = random_array(rng, (16, 8, 3, 3), low=-0.5, high=0.5)
    w2 = random_array(rng, (24, 16, 1, 1), low=-0.5, high=0.5)
    fc = random_array(rng, (24, 10), low=-0.5, high=0.5)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], name="conv2"),
        helper.make_node("Sigmoid", ["c2"], ["s2"], name="sig2"),
        helper.make_node("GlobalAveragePool", ["s2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc"], ["z"], name="fc"),
        helper.make_node("Softmax", ["z"], ["y"], name="softmax", axis=1),
    ]  # fmt: skip
    return make_model(
        nodes,
        [value_info("x", F32, (1, 8, 19, 19))],
        [value_info("y", F32, (1, 10))],
        {"w1": w1, "w2": w2, "fc": fc},
    )


def _small_cnn_reference(model, x: np.ndarray) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, {"x": x})[0]
