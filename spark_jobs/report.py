"""The verifier's report: a JSON document, a few lines for the terminal and a
self-contained HTML page with inline SVG plots (counts by class, latency histogram, lag
over time). No plotting library.

Exit rule: the run is OK only when missing, duplicate, phantom, reordered and altered are
all zero and no event is unverifiable for `statement_format` (`VerifyReport.ok`: an
outbox insert logged as a statement has no row image, so what was delivered for it can
never be proven); dead-lettered and other unverifiable events (`xa_undecided`,
`partition_truncated`, ...) are reported, not failures.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_jobs.reconcile_rules import ALL_CLASSES, BLOCKING_UNVERIFIABLE, PROBLEM_CLASSES

REPORT_VERSION = 1
CLASS_COLORS = {
    "delivered": "#2e7d32",
    "dead_lettered": "#6d4c41",
    "unverifiable": "#9e9e9e",
    "missing": "#c62828",
    "duplicate": "#ef6c00",
    "phantom": "#6a1b9a",
    "reordered": "#1565c0",
    "altered": "#ad1457",
}


@dataclass
class VerifyReport:
    summary: dict[str, Any]
    inputs: dict[str, Any]
    config: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    anomalies: list[str] = field(default_factory=list)
    json_path: str | None = None
    html_path: str | None = None
    missing_path: str | None = None
    created_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.summary["counts"])

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def problems(self) -> dict[str, int]:
        """The failure classes with their counts, and the unverifiable reasons that fail
        the run too (`BLOCKING_UNVERIFIABLE`: a statement-logged outbox insert, whose row
        the binlog does not hold, so no one can prove what was delivered for it)."""
        out = {c: self.summary["counts"].get(c, 0) for c in PROBLEM_CLASSES if self.summary["counts"].get(c, 0)}
        reasons = self.summary.get("unverifiable_reasons") or {}
        for reason in BLOCKING_UNVERIFIABLE:
            if reasons.get(f"event:{reason}"):
                out[reason] = reasons[f"event:{reason}"]
        return out

    @property
    def verified_through(self) -> dict[str, Any] | None:
        return self.summary.get("verified_through")

    def missing_events(self) -> list[dict[str, Any]]:
        """Every missing event with its full binlog coordinates (for `cdc repair`): the
        `missing.jsonl` file written next to the report, or the report's examples when
        there is no file."""
        return (
            list(iter_missing(self.missing_path)) if self.missing_path else list(self.summary.get("missing_events", []))
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "report_version": REPORT_VERSION,
            "created_at": self.created_at,
            "ok": self.ok,
            "exit_rule": "OK only when missing, duplicate, phantom, reordered and altered are all zero and no event "
            "is unverifiable for statement_format (an outbox insert logged as a statement)",
            "counts": self.counts,
            "problems": self.problems,
            **{k: v for k, v in self.summary.items() if k != "counts"},
            "inputs": self.inputs,
            "config": self.config,
            "binlog_anomalies": self.anomalies[:200],
            "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
            "files": {"json": self.json_path, "html": self.html_path, "missing": self.missing_path},
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.as_dict(), indent=indent, default=_json_default, sort_keys=False)

    def summary_text(self) -> str:
        return summary_text(self)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def iter_missing(path: str | Path | None) -> Iterator[dict[str, Any]]:
    if not path:
        return
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


# ---------------------------------------------------------------------------- terminal


def summary_text(rep: VerifyReport) -> str:
    c = rep.counts
    status = "OK" if rep.ok else "FAILED"
    lines = [
        f"cdc verify: {status} - " + " ".join(f"{k}={c.get(k, 0)}" for k in ALL_CLASSES),
    ]
    vt = rep.summary.get("verified_through") or {}
    fu = rep.summary.get("first_unproven")
    line = f"verified through {vt.get('file')}:{vt.get('pos')}"
    if fu:
        line += f" (first unproven event at {fu['file']}:{fu['pos']} row {fu['row']})"
    else:
        line += " (everything in range proven)"
    lines.append(line)
    lat = rep.summary.get("latency") or {}
    if lat.get("count"):
        lines.append(
            f"latency commit->broker ms: p50={lat['p50_ms']} p95={lat['p95_ms']} p99={lat['p99_ms']} max={lat['max_ms']}"
            " (commit time has 1 s resolution on MariaDB)"
        )
    aborted = rep.summary.get("aborted_records")
    if aborted is not None:
        lines.append(
            f"records in aborted Kafka transactions: {aborted['count']} (read_uncommitted minus "
            "read_committed; never seen by read_committed consumers, not a problem)"
        )
    ov = (rep.summary.get("order_violations") or {}).get("count", 0)
    if ov:
        lines.append(f"warning: {ov} record(s) go backwards in binlog order within their partition")
    examples = rep.summary.get("examples") or {}
    for cls in PROBLEM_CLASSES:
        for ex in (examples.get(cls) or [])[:2]:
            lines.append(f"  {cls}: {_one_line(ex)}")
    for reason in BLOCKING_UNVERIFIABLE:
        n = rep.problems.get(reason)
        if n:
            lines.append(
                f"  {n} outbox insert(s) logged as statements ({reason}): the binlog holds no row image to verify; "
                "set binlog_format=ROW for the server and the writing sessions"
            )
            for ex in [e for e in (examples.get("unverifiable") or []) if e.get("unverifiable_reason") == reason][:2]:
                lines.append(f"  {reason}: {_one_line(ex)}")
    if rep.json_path:
        lines.append(f"report: {rep.json_path}" + (f"  html: {rep.html_path}" if rep.html_path else ""))
    return "\n".join(lines)


def _one_line(ex: dict[str, Any]) -> str:
    if "binlog" in ex:
        b = ex["binlog"]
        where = f"{b['file']}:{b['pos']} row {b['row']}" + (f" gtid {b['gtid']}" if b.get("gtid") else "")
        dels = ", ".join(f"{d['topic']}[{d['partition']}]@{d['offset']}" for d in ex.get("deliveries", []))
        extra = f" reasons={','.join(ex['reasons'])}" if ex.get("reasons") else ""
        return f"{where} id={ex.get('event_id')} key={ex.get('aggregate_id')} -> {dels or 'no record'}{extra}"
    k = ex["kafka"]
    h = ex["headers"]
    return f"{k['topic']}[{k['partition']}]@{k['offset']} claims {h['file']}:{h['pos']} row {h['row']} gtid {h.get('gtid')}"


# -------------------------------------------------------------------------------- HTML


def _esc(v: Any) -> str:
    return html.escape(str(v), quote=True)


def svg_bars(
    items: list[tuple[str, float, str]], title: str, width: int = 640, bar_h: int = 22, unit: str = "count"
) -> str:
    """Horizontal bar chart: (label, value, color); the value axis is labelled with `unit`."""
    left, right = 120, 80
    h = 30 + bar_h * len(items) + 24
    top = max((v for _, v, _ in items), default=0) or 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" role="img" aria-label="{_esc(title)}">',
           f'<text x="4" y="18" font-size="14" font-weight="bold">{_esc(title)}</text>']  # fmt: skip
    for i, (label, value, color) in enumerate(items):
        y = 30 + i * bar_h
        w = (width - left - right) * (value / top) if value else 0
        out.append(
            f'<text x="{left - 6}" y="{y + bar_h * 0.7:.0f}" font-size="12" text-anchor="end">{_esc(label)}</text>'
        )
        out.append(
            f'<rect x="{left}" y="{y + 3}" width="{max(w, 1 if value else 0):.1f}" height="{bar_h - 6}" fill="{color}"/>'
        )
        out.append(f'<text x="{left + w + 4:.1f}" y="{y + bar_h * 0.7:.0f}" font-size="12">{int(value)}</text>')
    base = 30 + bar_h * len(items)
    out.append(f'<line x1="{left}" y1="{base}" x2="{width - right}" y2="{base}" stroke="#333"/>')
    out.append(f'<text x="{left}" y="{base + 12}" font-size="11">0</text>')
    out.append(f'<text x="{width - right}" y="{base + 12}" font-size="11" text-anchor="end">{_esc(unit)}</text>')
    out.append("</svg>")
    return "".join(out)


def svg_histogram(
    bins: list[dict[str, Any]],
    width_ms: int,
    title: str,
    width: int = 640,
    height: int = 240,
    x_label: str = "latency (ms)",
    y_label: str = "deliveries",
) -> str:
    pad_l, pad_b, pad_t = 50, 30, 28
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="{_esc(title)}">',
           f'<text x="4" y="18" font-size="14" font-weight="bold">{_esc(title)}</text>']  # fmt: skip
    if not bins:
        out.append('<text x="60" y="60" font-size="12">no data</text></svg>')
        return "".join(out)
    lo = bins[0]["from_ms"]
    hi = bins[-1]["from_ms"] + width_ms
    top = max(b["count"] for b in bins) or 1
    plot_w, plot_h = width - pad_l - 10, height - pad_b - pad_t
    scale = plot_w / max(hi - lo, 1)
    for b in bins:
        x = pad_l + (b["from_ms"] - lo) * scale
        bh = plot_h * b["count"] / top
        out.append(
            f'<rect x="{x:.1f}" y="{pad_t + plot_h - bh:.1f}" width="{max(width_ms * scale - 1, 1):.1f}" height="{bh:.1f}" fill="#1565c0">'
            f"<title>{b['from_ms']}..{b['from_ms'] + width_ms} ms: {b['count']}</title></rect>"
        )
    out.append(f'<line x1="{pad_l}" y1="{pad_t + plot_h}" x2="{pad_l + plot_w}" y2="{pad_t + plot_h}" stroke="#333"/>')
    out.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + plot_h}" stroke="#333"/>')
    out.append(f'<text x="{pad_l}" y="{height - 8}" font-size="11">{lo} ms</text>')
    out.append(
        f'<text x="{pad_l + plot_w / 2:.0f}" y="{height - 8}" font-size="11" text-anchor="middle">{_esc(x_label)}</text>'
    )
    out.append(f'<text x="{pad_l + plot_w}" y="{height - 8}" font-size="11" text-anchor="end">{hi} ms</text>')
    out.append(f'<text x="4" y="{pad_t + 10}" font-size="11">{top}</text>')
    out.append(f'<text x="4" y="{pad_t + plot_h}" font-size="11">0</text>')
    out.append(
        f'<text x="12" y="{pad_t + plot_h / 2:.0f}" font-size="11" transform="rotate(-90 12 {pad_t + plot_h / 2:.0f})" '
        f'text-anchor="middle">{_esc(y_label)}</text>'
    )
    out.append("</svg>")
    return "".join(out)


def svg_line(
    points: list[tuple[float, float]],
    title: str,
    x_label: str,
    y_label: str,
    width: int = 640,
    height: int = 240,
    unit: str = "ms",
) -> str:
    pad_l, pad_b, pad_t = 60, 30, 28
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="{_esc(title)}">',
           f'<text x="4" y="18" font-size="14" font-weight="bold">{_esc(title)}</text>']  # fmt: skip
    if not points:
        out.append('<text x="60" y="60" font-size="12">no data</text></svg>')
        return "".join(out)
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y1 = max(ys) or 1
    plot_w, plot_h = width - pad_l - 10, height - pad_b - pad_t

    def sx(x: float) -> float:
        return pad_l + (x - x0) / max(x1 - x0, 1) * plot_w

    def sy(y: float) -> float:
        return pad_t + plot_h - (y / y1) * plot_h

    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(points))
    out.append(f'<path d="{path}" fill="none" stroke="#c62828" stroke-width="1.5"/>')
    for x, y in points if len(points) <= 200 else []:
        out.append(
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="#c62828"><title>{_esc(x_label)} {int(x)}: {y:g} {_esc(unit)}</title></circle>'
        )
    out.append(f'<line x1="{pad_l}" y1="{pad_t + plot_h}" x2="{pad_l + plot_w}" y2="{pad_t + plot_h}" stroke="#333"/>')
    out.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + plot_h}" stroke="#333"/>')
    out.append(f'<text x="4" y="{pad_t + 10}" font-size="11">{y1:g} {_esc(unit)}</text>')
    out.append(f'<text x="4" y="{pad_t + plot_h}" font-size="11">0 {_esc(unit)}</text>')
    t0 = _dt.datetime.fromtimestamp(x0, _dt.UTC).strftime("%H:%M:%S")
    t1 = _dt.datetime.fromtimestamp(x1, _dt.UTC).strftime("%H:%M:%S")
    out.append(f'<text x="{pad_l}" y="{height - 8}" font-size="11">{t0} UTC</text>')
    out.append(
        f'<text x="{pad_l + plot_w / 2:.0f}" y="{height - 8}" font-size="11" text-anchor="middle">{_esc(x_label)} (UTC)</text>'
    )
    out.append(f'<text x="{pad_l + plot_w}" y="{height - 8}" font-size="11" text-anchor="end">{t1} UTC</text>')
    out.append(
        f'<text x="12" y="{pad_t + plot_h / 2:.0f}" font-size="11" transform="rotate(-90 12 {pad_t + plot_h / 2:.0f})" '
        f'text-anchor="middle">{_esc(y_label)} ({_esc(unit)})</text>'
    )
    out.append("</svg>")
    return "".join(out)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, default=_json_default)
    return str(v)


def html_tables(v: Any) -> str:
    """A value of the report's inputs as HTML: a mapping as a two-column table, a list of
    mappings as one table (a column per key), a list of plain values as one line."""
    if isinstance(v, dict):
        if not v:
            return "<em>none</em>"
        rows = "".join(f"<tr><th>{_esc(k)}</th><td>{html_tables(x)}</td></tr>" for k, x in v.items())
        return f"<table>{rows}</table>"
    if isinstance(v, (list, tuple)):
        if not v:
            return "<em>none</em>"
        if all(isinstance(x, dict) for x in v):
            cols = list(dict.fromkeys(k for x in v for k in x))
            head = "".join(f"<th>{_esc(c)}</th>" for c in cols)
            body = "".join("<tr>" + "".join(f"<td>{_esc(_cell(x.get(c)))}</td>" for c in cols) + "</tr>" for x in v)
            return f"<table><tr>{head}</tr>{body}</table>"
        return _esc(", ".join(_cell(x) for x in v))
    return _esc(_cell(v))


def render_html(rep: VerifyReport) -> str:
    c = rep.counts
    status = "OK" if rep.ok else "FAILED"
    bars = svg_bars(
        [(k, c.get(k, 0), CLASS_COLORS[k]) for k in ALL_CLASSES],
        "events and records by class",
        unit="events or records",
    )
    lat = rep.summary.get("latency") or {}
    hist = lat.get("histogram") or {}
    hist_svg = svg_histogram(hist.get("bins", []), hist.get("bin_width_ms", 1), "latency commit -> broker (ms)")
    lag = lat.get("lag_over_time") or {}
    lag_svg = svg_line(
        [(p["commit_second"], p["max_latency_ms"]) for p in lag.get("points", [])],
        f"max latency per {lag.get('bucket_seconds', 1)} s of commit time",
        "commit time",
        "max latency",
    )
    stats = ""
    if lat.get("count"):
        stats = (
            f"<p>latency over {lat['count']} deliveries: p50 {lat['p50_ms']} ms, p95 {lat['p95_ms']} ms, "
            f"p99 {lat['p99_ms']} ms, max {lat['max_ms']} ms. <em>{_esc(lat.get('note', ''))}</em></p>"
        )
    vt = rep.summary.get("verified_through") or {}
    fu = rep.summary.get("first_unproven")
    example_rows = []
    for cls, items in (rep.summary.get("examples") or {}).items():
        for ex in items:
            example_rows.append(f"<tr><td>{_esc(cls)}</td><td><code>{_esc(_one_line(ex))}</code></td></tr>")
    inputs = html_tables(rep.inputs)
    style = (
        "body{font-family:sans-serif;margin:24px;max-width:1000px}"
        ".ok{color:#2e7d32}.failed{color:#c62828}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 6px;font-size:12px;text-align:left}"
        "pre{background:#f5f5f5;padding:8px;font-size:11px;overflow:auto}"
    )
    extra = tuple(k for k in c if k not in ALL_CLASSES)  # the follow job's `repaired`
    count_rows = "".join(f"<tr><td>{k}</td><td>{c.get(k, 0)}</td></tr>" for k in (*ALL_CLASSES, *extra))
    follow_html = _follow_html(rep.summary.get("follow"))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>cdc verify: {status}</title><style>{style}</style></head>
<body>
<h1 class="{status.lower()}">cdc verify: {status}</h1>
<p>created {_esc(rep.created_at)}. {
        _esc("OK only when missing, duplicate, phantom, reordered and altered are all zero.")
    }</p>
<p>verified through <b>{_esc(vt.get("file"))}:{_esc(vt.get("pos"))}</b>{
        f" - first unproven event at {_esc(fu['file'])}:{_esc(fu['pos'])} row {_esc(fu['row'])}"
        if fu
        else " - everything in the range is proven"
    }</p>
<table><tr><th>class</th><th>count</th></tr>{count_rows}</table>
<div>{bars}</div>
{follow_html}
<h2>Latency</h2>{stats}
<div>{hist_svg}</div>
<div>{lag_svg}</div>
<h2>Examples</h2>
<table><tr><th>class</th><th>where</th></tr>{"".join(example_rows) or '<tr><td colspan="2">none</td></tr>'}</table>
<h2>What was read</h2>{inputs}
</body></html>
"""


def write_outputs(
    rep: VerifyReport, out_dir: str | Path, missing_rows: Iterator[dict[str, Any]] | None = None
) -> VerifyReport:
    """Write report.json, report.html and missing.jsonl into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if missing_rows is not None:
        path = out / "missing.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for row in missing_rows:
                fh.write(json.dumps(row, default=_json_default) + "\n")
        rep.missing_path = str(path)
    rep.json_path = str(out / "report.json")
    rep.html_path = str(out / "report.html")
    Path(rep.json_path).write_text(rep.to_json(), encoding="utf-8")
    Path(rep.html_path).write_text(render_html(rep), encoding="utf-8")
    return rep


def _follow_html(f: dict[str, Any] | None) -> str:
    """The following verifier's section: where it stands and its verified-through lag over time."""
    if not f:
        return ""
    rows = "".join(
        f"<tr><td>{_esc(k)}</td><td>{_esc(v if not isinstance(v, dict) else ', '.join(f'{a}: {b}' for a, b in v.items()))}</td></tr>"
        for k, v in f.items()
        if k != "lag_history"
    )
    lag = svg_line([(p["t"], p["lag_s"]) for p in f.get("lag_history") or []], "verified-through lag behind the binlog head",
                   "wall-clock time", "lag", unit="s")  # fmt: skip
    return f"<h2>Following</h2><table><tr><th>figure</th><th>value</th></tr>{rows}</table><div>{lag}</div>"
