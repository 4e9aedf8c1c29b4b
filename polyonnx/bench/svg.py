"""Inline SVG plots: a time series over runs, and a sparkline. No JavaScript: hovering a
point shows its ``<title>`` (the run, the commit, the time)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 700, 290
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 36, 74
SPARK_SPAN = 0.2
COLORS = {
    "polyonnx": "#1f6feb",
    "onnxruntime": "#e8710a",
    "numpy": "#6e7781",
    "regression": "#cf222e",
    "improvement": "#1a7f37",
}


@dataclass(frozen=True)
class Line:
    """One implementation's medians: ``points`` are (run index, seconds, hover text);
    ``spread`` the (run index, first quartile, third quartile) drawn as whiskers."""

    label: str
    points: tuple[tuple[int, float, str], ...]
    spread: tuple[tuple[int, float, float], ...] = ()
    dashed: bool = False


@dataclass(frozen=True)
class Marker:
    """A flagged change at a point: ``kind`` is "regression" or "improvement"."""

    index: int
    seconds: float
    kind: str
    label: str
    text: str


def time_unit(largest: float) -> tuple[str, float]:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if largest >= scale:
            return unit, scale
    return "ns", 1e-9


def nice_step(span: float, ticks: int = 4) -> float:
    """A 1, 2, 2.5 or 5 times a power of ten step that cuts ``span`` in about ``ticks``."""
    raw = span / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(f * magnitude for f in (1, 2, 2.5, 5, 10) if f * magnitude >= raw)


def number(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".") if value % 1 else f"{value:.0f}"


def time_plot(lines: list[Line], markers: list[Marker], runs: list[tuple[str, str]]) -> str:
    """Medians over runs (x: ``runs``, each (axis label, hover text)), y from 0."""
    values = [t for line in lines for _, t, _ in line.points]
    values += [hi for line in lines for _, _, hi in line.spread]
    unit, scale = time_unit(max(values))
    step = nice_step(max(values) / scale * 1.08)
    top = step * math.ceil(max(values) / scale * 1.08 / step)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(index: int) -> float:
        return LEFT + (index + 0.5) * plot_w / len(runs)

    def y(seconds: float) -> float:
        return TOP + plot_h * (1 - seconds / scale / top)

    out = [
        f'<svg class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        'xmlns="http://www.w3.org/2000/svg" role="img">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fff" '
        'stroke="#d0d7de"/>',
    ]
    tick = 0.0
    while tick <= top + step / 1e6:
        ty = TOP + plot_h * (1 - tick / top)
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#eaeef2"/>'
        )
        out.append(
            f'<text x="{LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end" class="tick">'
            f"{number(tick)} {unit}</text>"
        )
        tick += step
    every = max(1, math.ceil(len(runs) / 25))
    for index, (label, text) in enumerate(runs):
        if index % every and index != len(runs) - 1:
            continue
        lx, ly = x(index), TOP + plot_h + 12
        out.append(
            f'<text x="{lx:.1f}" y="{ly}" transform="rotate(-40 {lx:.1f} {ly})" '
            f'text-anchor="end" class="run"><title>{escape(text)}</title>'
            f"{escape(label)}</text>"
        )
    for line in lines:
        out += _line(line, x, y)
    for marker in markers:
        mx, my = x(marker.index), y(marker.seconds)
        color = COLORS[marker.kind]
        label_y = my - 12 if marker.kind == "regression" else my + 20
        out.append(
            f'<g class="flag {marker.kind}"><title>{escape(marker.text)}</title>'
            f'<circle cx="{mx:.1f}" cy="{my:.1f}" r="9" fill="none" stroke="{color}" '
            f'stroke-width="2"/><text x="{mx:.1f}" y="{label_y:.1f}" '
            f'text-anchor="middle" fill="{color}" class="flag-label">'
            f"{escape(marker.label)}</text></g>"
        )
    out += _legend(lines, markers)
    out.append("</svg>")
    return "\n".join(out)


def _line(line: Line, x, y) -> list[str]:
    color = COLORS.get(line.label, "#444")
    dash = ' stroke-dasharray="5 4"' if line.dashed else ""
    out = [f'<g class="series" data-impl="{escape(line.label)}">']
    for index, q1, q3 in line.spread:
        out.append(
            f'<line x1="{x(index):.1f}" x2="{x(index):.1f}" y1="{y(q1):.1f}" '
            f'y2="{y(q3):.1f}" stroke="{color}" stroke-opacity="0.45" '
            'stroke-width="3"/>'
        )
    if len(line.points) > 1:
        coords = " ".join(f"{x(i):.1f},{y(t):.1f}" for i, t, _ in line.points)
        out.append(
            f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"{dash}/>'
        )
    for index, seconds, text in line.points:
        out.append(
            f'<circle cx="{x(index):.1f}" cy="{y(seconds):.1f}" r="4" fill="{color}">'
            f"<title>{escape(text)}</title></circle>"
        )
    out.append("</g>")
    return out


def _legend(lines: list[Line], markers: list[Marker]) -> list[str]:
    entries = [(line.label, COLORS.get(line.label, "#444"), line.dashed) for line in lines]
    entries += [
        (kind, COLORS[kind], False)
        for kind in ("regression", "improvement")
        if any(m.kind == kind for m in markers)
    ]
    out, lx = [], LEFT
    for label, color, dashed in entries:
        if label in ("regression", "improvement"):
            out.append(
                f'<circle cx="{lx + 8}" cy="16" r="6" fill="none" stroke="{color}" '
                'stroke-width="2"/>'
            )
        else:
            dash = ' stroke-dasharray="5 4"' if dashed else ""
            out.append(
                f'<line x1="{lx}" x2="{lx + 18}" y1="16" y2="16" stroke="{color}" '
                f'stroke-width="3"{dash}/>'
            )
        out.append(f'<text x="{lx + 24}" y="20" class="legend">{escape(label)}</text>')
        lx += 34 + 8 * len(label)
    return out


def sparkline(values: list[float], kind: str | None, text: str) -> str:
    """A 110 x 24 trend of ``values`` (their range, or 20% of the largest where that is
    wider, so that noise stays flat); its last point red for a regression, green for an
    improvement."""
    width, height, pad = 110, 24, 3
    high = max(values)
    span = max(high - min(values), SPARK_SPAN * high)
    low = (high + min(values) - span) / 2

    def at(i: int, value: float) -> tuple[float, float]:
        sx = pad + (width - 2 * pad) * (i / (len(values) - 1) if len(values) > 1 else 0.5)
        sy = pad + (height - 2 * pad) * (1 - (value - low) / span)
        return sx, sy

    coords = " ".join(f"{sx:.1f},{sy:.1f}" for sx, sy in (at(i, v) for i, v in enumerate(values)))
    end_x, end_y = at(len(values) - 1, values[-1])
    color = COLORS.get(kind or "", COLORS["polyonnx"])
    return (
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg" role="img"><title>{escape(text)}</title>'
        f'<polyline points="{coords}" fill="none" stroke="{COLORS["polyonnx"]}" '
        f'stroke-width="1.5"/><circle cx="{end_x:.1f}" cy="{end_y:.1f}" r="3" '
        f'fill="{color}"/></svg>'
    )
