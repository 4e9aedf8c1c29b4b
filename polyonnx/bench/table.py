"""One terminal table of a run: polyonnx against its baselines, ratios, GFLOP/s, % peak.

Columns: the polyonnx median and the baselines' (onnxruntime; numpy's OpenBLAS for
MatMul), the ratios polyonnx / baseline (< 1: polyonnx is faster): of the medians, and
paired (the median of per-round ratios of rounds that alternated the two, paired.py; the
steadier figure on a noisy machine), and for contractions polyonnx's GFLOP/s and its
percent of the FMA peak of the cores it used (peak.py), both of the direct algorithm's
flops (a Winograd Conv's effective rate may pass the peak).
"""

from __future__ import annotations

from polyonnx.bench.cases import Row, seconds

HEADER = [
    "benchmark",
    "threads",
    "polyonnx",
    "onnxruntime",
    "numpy",
    "ratio ort",
    "ratio numpy",
    "paired ort",
    "paired numpy",
    "GFLOP/s",
    "% peak",
]


def cells(row: Row, peak_per_core: float | None) -> list[str]:
    ours = row.medians["polyonnx"]
    ort, blas = row.medians.get("onnxruntime"), row.medians.get("numpy")
    ratio = [f"{ours / base:.2f}" if base else "-" for base in (ort, blas)]
    pairs = [row.paired.get(base) for base in ("onnxruntime", "numpy")]
    ratio += [f"{value:.2f}" if value else "-" for value in pairs]
    rate = row.flops / ours / 1e9 if row.flops else None
    percent, peak = "-", row.peak or peak_per_core
    if rate and peak:
        percent = f"{100 * rate / (peak * row.threads):.0f}%"
    rate_cell = f"{rate:.1f}" if rate else "-"
    return [
        row.case,
        str(row.threads),
        seconds(ours),
        seconds(ort),
        seconds(blas),
        *ratio,
        rate_cell,
        percent,
    ]


def print_table(rows: list[Row], peak_per_core: float | None) -> None:
    body = [cells(row, peak_per_core) for row in rows]
    try:
        from rich import box
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [HEADER, *body]) for i in range(len(HEADER))]
        for i, line in enumerate([HEADER, *body]):
            left = line[0].ljust(widths[0])
            print(
                "  ".join([left] + [c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)])
            )
            if i == 0:
                print("  ".join("-" * w for w in widths))
        return
    table = Table(*HEADER, box=box.SIMPLE_HEAD)
    for column in table.columns[1:]:
        column.justify = "right"
    for line in body:
        table.add_row(*line)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(table)
