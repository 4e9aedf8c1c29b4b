"""The measured FMA peak: a loop LLVM cannot fold away, timed at a plausible clock."""

from __future__ import annotations

from polyonnx.bench.peak import FMA_PIPES, measured_clock, peak_per_core
from polyonnx.emit.fmapeak import fma_peak_gflops
from polyonnx.target import host_target


def test_the_fma_loop_runs_at_a_plausible_clock():
    # a folded or scalarised loop would be far above 6 GHz of these pipes, or far below 0.5
    rate = fma_peak_gflops(host_target(), trials=3, flops=2e8)
    ghz, how = measured_clock()
    assert 0.5 < ghz < 6.0, how
    peak, _ = peak_per_core(ghz)
    # a quarter, not a half: the clock and the rate are measured at different moments, and
    # under the test suite's other workers the rate was once below half (a scalar loop
    # would run at 1/8 or 1/16 of the peak, a folded one far above it)
    assert 0.25 * peak < rate < 1.5 * peak
    assert "measured" in how and FMA_PIPES == 2
