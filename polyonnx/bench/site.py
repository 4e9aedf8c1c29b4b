"""The dashboard: a static site of the history that works offline (inline CSS and SVG,
no script, nothing fetched).

One page per machine (``index.html`` for the machine of the newest run,
``machine-<slug>.html`` for the others), each with: the flagged changes, an overview
table (latest polyonnx and baseline times, ratios, GFLOP/s, % of peak, last change,
trend), a panel per benchmark (its series over the runs, commits on the axis and on
hover) and the list of runs.
"""

from __future__ import annotations

import pathlib
import re
from html import escape

from polyonnx.bench.cases import BASELINES
from polyonnx.bench.cases import seconds as terminal_seconds
from polyonnx.bench.compare import Point, Series, by_machine
from polyonnx.bench.compare import machine_series as series_of
from polyonnx.bench.history import Machine, Run
from polyonnx.bench.levels import DEFAULT, Settings
from polyonnx.bench.svg import Line, Marker, sparkline, time_plot

FLAGGED_SHOWN = 40
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1f2328; margin: 0 auto;
       max-width: 1240px; padding: 0 20px 40px; }
h1 { font-size: 24px; margin: 20px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 15px; margin: 0 0 4px; }
.muted, .legend-text { color: #59636e; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eaeef2; text-align: right;
         white-space: nowrap; }
th { background: #f6f8fa; position: sticky; top: 0; }
td:first-child, th:first-child { text-align: left; }
tr.regression { background: #ffebe9; }
tr.improvement { background: #dafbe1; }
.regression-text { color: #cf222e; font-weight: 600; }
.improvement-text { color: #1a7f37; font-weight: 600; }
.faster { color: #1a7f37; }
.slower { color: #cf222e; }
.panel { border: 1px solid #d0d7de; border-radius: 6px; padding: 10px 12px;
         margin: 12px 0; }
.panel-body { display: flex; gap: 16px; align-items: flex-start; flex-wrap: wrap; }
.runs-scroll { max-height: 290px; overflow-y: auto; font-size: 12px; }
.runs-scroll td, .runs-scroll th { padding: 2px 6px; }
.plot text { font-size: 11px; fill: #59636e; }
.plot .legend { font-size: 12px; fill: #1f2328; }
.plot .flag-label { font-size: 11px; font-weight: 600; }
.plot .regression .flag-label { fill: #cf222e; }
.plot .improvement .flag-label { fill: #1a7f37; }
.plot circle:hover { r: 6; }
nav a { margin-right: 12px; }
#overview td:first-child { white-space: normal; overflow-wrap: anywhere; max-width: 230px; }
"""


def seconds(value: float | None) -> str:
    return "–" if value is None else terminal_seconds(value).replace(" us", " µs")


def slug(series: Series) -> str:
    return "b-" + re.sub(r"[^a-zA-Z0-9]+", "-", f"{series.case}-{series.threads}t").strip("-")


def page_name(machine: Machine, first: bool) -> str:
    return "index.html" if first else f"machine-{machine.slug}.html"


def write_site(
    runs: list[Run],
    out: pathlib.Path,
    settings: Settings = DEFAULT,
) -> list[pathlib.Path]:
    """Write the dashboard of ``runs`` into ``out``; the pages written, index.html first."""
    out.mkdir(parents=True, exist_ok=True)
    machines = by_machine(runs)
    names = {m: page_name(m, i == 0) for i, m in enumerate(machines)}
    if not machines:
        path = out / "index.html"
        path.write_text(document("polyonnx performance", [empty_page()]), encoding="utf8")
        return [path]
    written = []
    for machine, machine_runs in machines.items():
        series = series_of(machine_runs, settings)
        body = machine_page(machine, machine_runs, series, names, settings)
        path = out / names[machine]
        path.write_text(document(f"polyonnx performance · {machine.node}", body), "utf8")
        written.append(path)
    return written


def document(title: str, body: list[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            '<link rel="icon" href="data:,">',
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
            *body,
            "</body></html>",
        ]
    )


def empty_page() -> str:
    return (
        "<h1>polyonnx performance</h1><p>No saved runs yet. Run "
        "<code>polyonnx bench --save</code> (twice or more to see trends), then "
        "<code>polyonnx dashboard</code> again.</p>"
    )


def machine_page(
    machine: Machine,
    runs: list[Run],
    series: list[Series],
    names: dict[Machine, str],
    settings: Settings,
) -> list[str]:
    latest = runs[-1]
    body = ["<h1>polyonnx performance</h1>"]
    if len(names) > 1:
        links = [
            f'<a href="{names[m]}">{"<b>" if m == machine else ""}{escape(m.label)}'
            f"{'</b>' if m == machine else ''}</a>"
            for m in names
        ]
        body.append(f"<nav>Machines: {' '.join(links)}</nav>")
    versions = ", ".join(
        part
        for part in (
            latest.polyonnx_version and f"polyonnx {latest.polyonnx_version}",
            latest.llvm_version and f"LLVM {latest.llvm_version}",
            latest.suite and f"{latest.suite} suite",
        )
        if part
    )
    body.append(
        f"<p><b>{escape(machine.label)}</b> — {len(runs)} run{'s' * (len(runs) != 1)} "
        f"from {escape(runs[0].date)} to {escape(latest.date)} UTC. Latest: run "
        f"#{latest.number}, commit <code>{escape(latest.short_commit)}</code>"
        f"{' (uncommitted changes)' if latest.dirty else ''}"
        f"{', ' + escape(versions) if versions else ''}.</p>"
    )
    body.append(
        '<p class="muted">Times are medians over the rounds of a run; bars in the plots '
        "span the first to third quartile. ratio = polyonnx time / baseline time (onnxruntime; "
        "numpy's OpenBLAS for MatMul), measured in the same run: below 1, polyonnx is faster. "
        f"A run is flagged when its polyonnx median is at least {settings.threshold:.1%} "
        f"slower (regression) or faster (improvement) than the level its series had (the "
        f"mean of the first {settings.window} runs since the last flagged change) and that "
        f"change is at least {settings.z_min:g} times its noise (the spread between runs, "
        f"and the run's own spread over its rounds): run-to-run wobble is not flagged. A "
        f"series has no verdict (–) until its first {settings.window} runs have set a level. "
        "Hover over a point for its commit and values.</p>"
    )
    body += flagged_section(series)
    body += overview_section(series, latest)
    body.append("<h2>Benchmarks</h2>")
    body += [panel(s, runs) for s in series]
    body += runs_section(runs)
    return body


def baselines_moved(point: Point) -> str:
    """How the baselines moved against the same reference runs, e.g. "onnxruntime +3.1%"."""
    return ", ".join(f"{impl} {change:+.1%}" for impl, change in point.baseline_changes.items())


def change_cell(point: Point, word: bool = False) -> tuple[str, str]:
    """(the HTML of a point's change against its reference, the row class); ``word``:
    say "regression" or "improvement" after the number."""
    verdict = point.verdict
    if verdict is None:
        return '<span class="muted" title="too few runs to set a level">–</span>', ""
    text = f"{verdict.change:+.1%}"
    moved = baselines_moved(point)
    title = escape(verdict.describe() + (f"; baselines: {moved}" if moved else ""))
    if verdict.kind == "outlier":
        return f'<span class="muted" title="{title}">{text} outlier</span>', ""
    if not verdict.flagged:
        return f'<span class="muted" title="{title}">{text}</span>', ""
    arrow = "▲" if verdict.kind == "regression" else "▼"
    cls = f"{verdict.kind}-text"
    text = f"{arrow} {text}" + (f" {verdict.kind}" if word else "")
    return f'<span class="{cls}" title="{title}">{text}</span>', verdict.kind


def ratio_cell(ours: float, base: float | None) -> str:
    if base is None:
        return '<td class="muted">–</td>'
    ratio = ours / base
    cls = "faster" if ratio < 0.95 else "slower" if ratio > 1.05 else ""
    return f'<td class="{cls}">{ratio:.2f}</td>'


def rate_cells(series: Series, point: Point) -> str:
    if not series.flops:
        return '<td class="muted">–</td><td class="muted">–</td>'
    rate = series.flops / point.polyonnx.median / 1e9
    if point.run.peak is None:
        return f'<td>{rate:.1f}</td><td class="muted">–</td>'
    percent = 100 * rate / (point.run.peak * series.threads)
    title = f"of {point.run.peak:.1f} GFLOP/s per core x {series.threads}"
    return f'<td>{rate:.1f}</td><td title="{title}">{percent:.0f}%</td>'


def flagged_section(series: list[Series]) -> list[str]:
    events = [(p, s) for s in series for p in s.points if p.verdict and p.verdict.flagged]
    events.sort(key=lambda event: (event[0].run.datetime, event[1].case), reverse=True)
    if not events:
        return ["<h2>Flagged changes</h2><p>None: no run changed a benchmark significantly.</p>"]
    rows = []
    for point, s in events[:FLAGGED_SHOWN]:
        change, cls = change_cell(point, word=True)
        rows.append(
            f'<tr class="{cls}"><td><a href="#{slug(s)}">{escape(s.name)}</a></td>'
            f"<td>{change}</td><td>{seconds(point.verdict.before)} → "
            f"{seconds(point.polyonnx.median)}</td>"
            f"<td>{escape(baselines_moved(point)) or '–'}</td>"
            f'<td title="{escape(point.run.date)} UTC">#{point.run.number} '
            f"{escape(point.run.short_commit)}</td></tr>"
        )
    head = (
        "<tr><th>benchmark</th><th>change</th><th>polyonnx</th>"
        '<th title="against the same runs: a baseline that moved as much points at the '
        'machine">baselines meanwhile</th><th>at run</th></tr>'
    )
    shown = f"the {FLAGGED_SHOWN} newest of {len(events)}" if len(events) > FLAGGED_SHOWN else ""
    return [
        f'<h2>Flagged changes <span class="muted">({shown or len(events)})</span></h2>',
        f'<table id="flagged">{head}{"".join(rows)}</table>',
    ]


def overview_section(series: list[Series], latest: Run) -> list[str]:
    head = (
        "<tr><th>benchmark</th><th>threads</th><th>polyonnx</th><th>onnxruntime</th>"
        "<th>numpy</th><th>ratio ort</th><th>ratio numpy</th><th>GFLOP/s</th>"
        "<th>% peak</th><th>last change</th><th>trend</th></tr>"
    )
    rows = []
    for s in series:
        point = s.latest
        ours = point.polyonnx.median
        base = {impl: point.baselines[impl].median for impl in point.baselines}
        change, cls = change_cell(point)
        stale = ""
        if point.run is not latest:
            stale = (
                f' <span class="muted" title="not in the latest run">(#{point.run.number})</span>'
            )
        recent = s.points[-30:]
        trend = sparkline(
            [p.polyonnx.median for p in recent],
            point.verdict.kind if point.verdict and point.verdict.flagged else None,
            f"polyonnx over the last {len(recent)} runs: "
            f"{seconds(recent[0].polyonnx.median)} → {seconds(ours)}",
        )
        rows.append(
            f'<tr class="{cls}"><td><a href="#{slug(s)}">{escape(s.case)}</a>{stale}</td>'
            f"<td>{s.threads}</td><td>{seconds(ours)}</td>"
            + "".join(f"<td>{seconds(base.get(impl))}</td>" for impl in BASELINES)
            + "".join(ratio_cell(ours, base.get(impl)) for impl in BASELINES)
            + rate_cells(s, point)
            + f"<td>{change}</td><td>{trend}</td></tr>"
        )
    return [
        f'<h2>Overview <span class="muted">({len(series)} benchmarks)</span></h2>',
        f'<table id="overview">{head}{"".join(rows)}</table>',
    ]


def point_text(point: Point, impl: str) -> str:
    m = point.polyonnx if impl == "polyonnx" else point.baselines[impl]
    run = point.run
    return (
        f"{impl} {seconds(m.median)} (quartiles {seconds(m.q1)} – {seconds(m.q3)}, "
        f"{m.rounds} rounds)\nrun #{run.number}, commit {run.commit[:12]}"
        f"{' with uncommitted changes' if run.dirty else ''}, {run.date} UTC"
    )


def panel(series: Series, runs: list[Run]) -> str:
    points = series.points
    lines = [
        Line(
            "polyonnx",
            tuple((p.index, p.polyonnx.median, point_text(p, "polyonnx")) for p in points),
            tuple((p.index, p.polyonnx.q1, p.polyonnx.q3) for p in points),
        )
    ]
    for impl in BASELINES:
        theirs = [p for p in points if impl in p.baselines]
        if theirs:
            values = tuple((p.index, p.baselines[impl].median, point_text(p, impl)) for p in theirs)
            lines.append(Line(impl, values, dashed=impl == "numpy"))
    markers = [
        Marker(
            p.index,
            p.polyonnx.median,
            p.verdict.kind,
            f"{p.verdict.change:+.0%}",
            f"{p.verdict.kind} at run #{p.run.number} ({p.run.short_commit}): "
            f"{p.verdict.describe()}",
        )
        for p in points
        if p.verdict and p.verdict.flagged
    ]
    axis = [
        (f"#{run.number} {run.short_commit}", f"run #{run.number}, {run.commit}, {run.date} UTC")
        for run in runs
    ]
    latest = points[-1]
    summary = ", ".join(
        [f"polyonnx {seconds(latest.polyonnx.median)}"]
        + [f"{impl} {seconds(m.median)}" for impl, m in latest.baselines.items()]
    )
    return (
        f'<section class="panel" id="{slug(series)}"><h3>{escape(series.name)}</h3>'
        f'<p class="muted">latest (run #{latest.run.number}): {summary}; '
        f"{len(points)} run{'s' * (len(points) != 1)}</p>"
        f'<div class="panel-body">{time_plot(lines, markers, axis)}'
        f'<div class="runs-scroll">{run_table(series)}</div></div></section>'
    )


def run_table(series: Series) -> str:
    """Every run of a series, newest first: polyonnx, the baselines it has, the change."""
    impls = [impl for impl in BASELINES if any(impl in p.baselines for p in series.points)]
    head = "<tr><th>run</th><th>polyonnx</th>"
    head += "".join(f"<th>{impl}</th>" for impl in impls) + "<th>change</th></tr>"
    rows = []
    for p in reversed(series.points):
        change, cls = change_cell(p)
        base = "".join(
            f"<td>{seconds(p.baselines[impl].median if impl in p.baselines else None)}</td>"
            for impl in impls
        )
        run = f'<span title="{escape(p.run.date)} UTC">#{p.run.number} {p.run.short_commit}</span>'
        rows.append(
            f'<tr class="{cls}"><td>{run}</td><td>{seconds(p.polyonnx.median)}</td>{base}'
            f"<td>{change}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def runs_section(runs: list[Run]) -> list[str]:
    head = (
        "<tr><th>run</th><th>commit</th><th>date (UTC)</th><th>branch</th><th>suite</th>"
        "<th>polyonnx</th><th>LLVM</th><th>benchmarks</th><th>per-round data</th>"
        "<th>file</th></tr>"
    )
    rows = [
        f"<tr><td>#{run.number}</td><td><code title='{escape(run.commit)}'>"
        f"{escape(run.short_commit)}</code></td><td>{escape(run.date)}</td>"
        f"<td>{escape(run.branch)}</td><td>{escape(run.suite or '–')}</td>"
        f"<td>{escape(run.polyonnx_version or '–')}</td>"
        f"<td>{escape(run.llvm_version or '–')}</td><td>{len(run.measurements)}</td>"
        f"<td>{'yes' if run.has_data else 'no'}</td><td>{escape(run.name)}</td></tr>"
        for run in reversed(runs)
    ]
    return [
        '<h2>Runs <span class="muted">(newest first; "+" after a commit: uncommitted '
        "changes)</span></h2>",
        f'<table id="runs">{head}{"".join(rows)}</table>',
    ]
