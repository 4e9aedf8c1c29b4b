"""What a saved run records about the code and the CPU beyond pytest-benchmark's own
machine_info (node, CPU brand, core count, Python): polyonnx's and LLVM's versions, the
target polyonnx compiles for, and the FMA peak the dashboard's "% peak" divides by.

perf/conftest.py stores ``polyonnx_info()`` as ``machine_info["polyonnx"]``.
"""

from __future__ import annotations


def polyonnx_info() -> dict[str, object]:
    import llvmlite
    import llvmlite.binding as llvm

    import polyonnx
    from polyonnx.bench.peak import clock, peak_per_core
    from polyonnx.target import host_target

    target = host_target()
    ghz, clock_source = clock()
    peak, how = peak_per_core(ghz)
    return {
        "version": polyonnx.__version__,
        "llvm_version": ".".join(str(part) for part in llvm.llvm_version_info),
        "llvmlite_version": llvmlite.__version__,
        "target": target.name,
        "vector_bits": target.vector_bits,
        "clock_ghz": ghz,
        "clock_source": clock_source,
        "peak_gflops_per_core": peak,
        "peak": how,
    }
