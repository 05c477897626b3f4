"""The report page: one self-contained HTML file with inline SVG plots (no scripts, no fonts, no
network), readable offline and attachable to a ticket."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from plugbroker.analyze.events import LATENCY_BOUNDS, MESSAGE_EVENTS

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#1f2937;
background:#f3f4f6}
header{background:#111827;color:#f9fafb;padding:18px 28px}
header h1{margin:0 0 4px;font-size:22px}header p{margin:0;color:#d1d5db}
main{padding:18px 28px;max-width:1500px;box-sizing:border-box}
h2{font-size:18px;margin:28px 0 10px;border-bottom:2px solid #d1d5db;padding-bottom:4px}
h3{font-size:15px;margin:0 0 6px}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{background:#fff;border-radius:8px;padding:10px 14px;box-shadow:0 1px 2px #0002;
      min-width:120px}
.card b{display:block;font-size:20px}.card span{color:#6b7280;font-size:12px}
.queue{background:#fff;border-radius:8px;padding:12px 14px;margin:12px 0;box-shadow:0 1px 2px #0002}
.plots{display:flex;flex-wrap:wrap;gap:8px}
.facts{color:#4b5563;font-size:13px;margin-bottom:6px}
table{border-collapse:collapse;background:#fff;font-size:12.5px;box-shadow:0 1px 2px #0002}
th,td{padding:4px 6px;border-bottom:1px solid #e5e7eb;text-align:right;white-space:nowrap}
th{background:#f9fafb;position:sticky;top:0;white-space:normal;vertical-align:bottom}
td.l,th.l{text-align:left}td.l{white-space:normal;overflow-wrap:anywhere;min-width:7em}
td .sub{display:block;color:#6b7280;font-size:11px}
h3 .sub{color:#6b7280;font-weight:400;font-size:12px;margin-left:8px}
dl.legend{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;font-size:13px;
          background:#fff;padding:8px 12px;border-radius:8px;box-shadow:0 1px 2px #0002;
          max-width:1000px}
dl.legend dt{font-weight:600}dl.legend dd{margin:0;color:#374151}
tr.warn td{background:#fef2f2}
.scroll{max-height:460px;overflow:auto;display:inline-block;max-width:100%}
.warn{color:#b91c1c}.muted{color:#6b7280}
svg text{font:11px system-ui,sans-serif;fill:#374151}
footer{padding:18px 28px;color:#6b7280;font-size:12px}
"""


# ------------------------------------------------------------------------------ formatting


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def fmt_num(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        a = abs(v)
        if a >= 1e6:
            return f"{v / 1e6:.1f}M"
        if a >= 1e4:
            return f"{v / 1e3:.0f}k"
        if a >= 100 or v == int(v):
            return f"{v:,.0f}"
        return f"{v:.2f}" if a >= 1 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return esc(v)


def fmt_dur(v: Any) -> str:
    """Seconds as 850µs, 12ms, 3.4s, 5m12s, 2h03m."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    v = float(v)
    if v == 0:
        return "0"
    if v < 1e-3:
        return f"{v * 1e6:.0f}µs"
    if v < 1:
        return f"{v * 1e3:.3g}ms"
    if v < 60:
        return f"{v:.3g}s"
    if v < 3600:
        return f"{int(v // 60)}m{int(v % 60):02d}s"
    return f"{int(v // 3600)}h{int(v % 3600 // 60):02d}m"


def fmt_bytes(v: Any) -> str:
    if v is None:
        return "–"
    v = float(v)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(v) < 1024 or unit == "GB":
            return f"{v:.0f}{unit}" if unit == "B" else f"{v:.1f}{unit}"
        v /= 1024
    return f"{v:.1f}GB"


def fmt_time(ts: Any, with_date: bool = False) -> str:
    if ts is None:
        return "–"
    d = datetime.fromtimestamp(float(ts), tz=UTC)
    return d.strftime("%Y-%m-%d %H:%M:%S UTC" if with_date else "%H:%M:%S")


def short_label(i: int) -> str:
    """A histogram bucket's upper bound (``≤20ms``), short enough to sit under a bar."""
    if i >= len(LATENCY_BOUNDS):
        return f">{fmt_dur(LATENCY_BOUNDS[-1])}"
    return f"≤{fmt_dur(LATENCY_BOUNDS[i])}"


# ------------------------------------------------------------------------------ SVG plots


def _svg_open(width: int, height: int, title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">'
    )


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * exp >= v:
            return m * exp
    return 10 * exp


def line_chart(
    title: str,
    xs: Sequence[float],
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    y_fmt: Callable[[Any], str] = fmt_num,
    width: int = 290,
    height: int = 190,
    xlim: tuple[float, float] | None = None,
) -> str:
    """A line chart of one or more series over time (x in epoch seconds)."""
    left, right, top, bottom = 56, 10, 24, 34
    pw, ph = width - left - right, height - top - bottom
    out = [
        _svg_open(width, height, title),
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="6" y="15" font-weight="600">{esc(title)}</text>',
    ]
    if not xs:
        out.append(f'<text x="{left + 10}" y="{top + ph / 2}" class="muted">no data</text></svg>')
        return "".join(out)
    x0, x1 = xlim if xlim is not None else (min(xs), max(xs))
    if x1 <= x0:
        x1 = x0 + 1
    ymax = _nice_max(max((max(ys) for _, ys in series if ys), default=0.0))

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y / ymax) * ph

    for i in range(5):
        y = ymax * i / 4
        yy = sy(y)
        out.append(
            f'<line x1="{left}" y1="{yy:.1f}" x2="{left + pw}" y2="{yy:.1f}" stroke="#e5e7eb"/>'
        )
        out.append(
            f'<text x="{left - 4}" y="{yy + 4:.1f}" text-anchor="end">{esc(y_fmt(y))}</text>'
        )
    span = x1 - x0
    for i in range(3):  # three time labels fit under a narrow chart without touching
        x = x0 + span * i / 2
        label = fmt_time(x) if span >= 120 else f"+{x - x0:.3g}s"
        anchor = "start" if i == 0 else "end" if i == 2 else "middle"
        out.append(
            f'<text x="{sx(x):.1f}" y="{top + ph + 16}" text-anchor="{anchor}">{esc(label)}</text>'
        )
    out.append(
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#9ca3af"/>'
    )
    lx = left + pw - sum(7 * len(name) + 22 for name, _ in series) if len(series) > 1 else 0
    for i, (name, ys) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys))
        out.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.6" '
            f'stroke-linejoin="round" points="{pts}"/>'
        )
        if len(series) > 1:
            out.append(
                f'<rect x="{lx}" y="7" width="10" height="10" fill="{color}"/>'
                f'<text x="{lx + 13}" y="16">{esc(name)}</text>'
            )
            lx += 7 * len(name) + 22
    out.append("</svg>")
    return "".join(out)


def bar_chart(
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    *,
    width: int = 290,
    height: int = 190,
    color: str = PALETTE[0],
    highlight: Iterable[int] = (),
) -> str:
    """Vertical bars with a label under each (every other label when they are crowded).

    Labels that do not fit side by side are tilted; the margins grow to hold the longest one
    (about 6.5 px per character at 11 px), so no label is cut off at the edge of the plot."""
    left, right, top, bottom = 46, 8, 24, 46
    n = max(len(values), 1)
    longest = max((len(label) for label in labels), default=1)
    bw = (width - left - right) / n
    upright = bw >= 6.5 * longest + 4  # labels fit side by side: no need to tilt them
    if not upright:
        # a label tilted by 35 degrees reaches cos(35) x its length to the left of its bar's
        # middle, and sin(35) x its length down
        first = len(labels[0]) if labels else 1
        left = max(left, math.ceil(5.4 * first - bw / 2) + 4)
        bw = (width - left - right) / n
        extra = max(0, math.ceil(3.8 * longest) + 18 - bottom)
        bottom += extra
        height += extra
    pw, ph = width - left - right, height - top - bottom
    out = [
        _svg_open(width, height, title),
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="6" y="15" font-weight="600">{esc(title)}</text>',
    ]
    if not values or max(values) <= 0:
        out.append(f'<text x="{left + 10}" y="{top + ph / 2}">no data</text></svg>')
        return "".join(out)
    ymax = _nice_max(max(values))
    hl = set(highlight)
    for i in range(5):
        y = ymax * i / 4
        yy = top + ph - y / ymax * ph
        out.append(
            f'<line x1="{left}" y1="{yy:.1f}" x2="{left + pw}" y2="{yy:.1f}" '
            f'stroke="#e5e7eb"/><text x="{left - 4}" y="{yy + 4:.1f}" '
            f'text-anchor="end">{esc(fmt_num(y))}</text>'
        )
    every = 1 if upright else max(1, math.ceil(n * 34 / pw))
    for i, (label, v) in enumerate(zip(labels, values)):
        h = v / ymax * ph
        x = left + i * bw
        fill = PALETTE[1] if i in hl else color
        out.append(
            f'<rect x="{x + 1:.1f}" y="{top + ph - h:.1f}" width="{max(bw - 2, 1):.1f}" '
            f'height="{h:.1f}" fill="{fill}"><title>{esc(label)}: {v:g}</title></rect>'
        )
        if i % every == 0:
            cx = x + bw / 2
            if upright:
                out.append(
                    f'<text x="{cx:.1f}" y="{top + ph + 14}" text-anchor="middle">'
                    f"{esc(label)}</text>"
                )
            else:
                out.append(
                    f'<text x="{cx:.1f}" y="{top + ph + 12}" text-anchor="end" '
                    f'transform="rotate(-35 {cx:.1f} {top + ph + 12})">{esc(label)}</text>'
                )
    out.append("</svg>")
    return "".join(out)


def hbar_chart(
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    *,
    width: int = 640,
    color: str = PALETTE[0],
) -> str:
    """Horizontal bars, one row per label, the label in full on the left of its bar."""
    row = 20
    longest = max((len(label) for label in labels), default=1)
    left = min(max(80, math.ceil(6.5 * longest) + 14), width // 2)
    right, top = 60, 28
    height = top + row * max(len(values), 1) + 10
    pw = width - left - right
    out = [
        _svg_open(width, height, title),
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="6" y="15" font-weight="600">{esc(title)}</text>',
    ]
    if not values or max(values) <= 0:
        out.append(f'<text x="{left}" y="{top + 14}">no data</text></svg>')
        return "".join(out)
    vmax = max(values)
    for i, (label, v) in enumerate(zip(labels, values)):
        y = top + i * row
        w = max(v / vmax * pw, 1.0)
        out.append(
            f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{esc(label)}</text>'
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{color}">'
            f"<title>{esc(label)}: {v:g}</title></rect>"
            f'<text x="{left + w + 4:.1f}" y="{y + 14}">{esc(fmt_num(v))}</text>'
        )
    out.append("</svg>")
    return "".join(out)


#: what each ``outcome`` of a policy action means (the page's legend)
OUTCOMES = (
    ("applied", "the core did it (a channel closed, a queue deleted, a consumer isolated ...)"),
    (
        "spared",
        "the policy chose not to act this time (e.g. a consumer it protects); nothing happened",
    ),
    ("logged", "a dry run (policy Log): only logged, nothing happened"),
    (
        "stale",
        "the action found nothing to act on when the core came to do it (the consumer or queue "
        "was already gone, or the figure was back under its threshold); nothing happened",
    ),
    (
        "deferred",
        "held back by the vhost's <blastRadius> budget; the policy asks again at its next check",
    ),
)
#: what the fates and reasons of the dead-letter table mean
FATES = (
    ("dead-lettered", "republished to the queue's dead-letter target (a DLQ), with x-death"),
    ("dropped", "discarded: the queue had no dead-letter target"),
    ("rejected", "a consumer rejected or nacked it without requeue"),
    ("expired", "its TTL ran out while it waited"),
    ("maxlen", "the queue's length limit pushed it out"),
    ("delivery_limit", "redelivered or retried more than maxRedeliveries times"),
    ("poison", "consumers kept taking it without settling it (see isolation)"),
)


def _legend(items: Sequence[tuple[str, str]]) -> str:
    return (
        "<dl class='legend'>"
        + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items)
        + "</dl>"
    )


def subscription_label(bindings: Sequence[tuple[str, str]]) -> str:
    """``stocks.us.ibm on amq.topic`` (several bindings joined with ``;``)."""
    return "; ".join(f"{key or '(empty key)'} on {ex}" for ex, key in bindings)


def queue_cell(
    vhost: str, queue: str, bindings: dict[tuple[str, str], list[tuple[str, str]]]
) -> str:
    """A queue for a table cell (HTML): a server-named queue by its bindings, with its name
    under them; any other queue by its name."""
    bound = bindings.get((vhost, queue))
    if bound and queue.startswith("amq.gen-"):
        return f"{esc(subscription_label(bound))}<span class='sub'>{esc(queue)}</span>"
    return esc(queue)


def _html(value: Any) -> str:
    """A cell already rendered as HTML."""
    return "" if value is None else str(value)


# ------------------------------------------------------------------------------ the page


def _table(
    rows: Sequence[dict[str, Any]],
    cols: Sequence[tuple[str, str, Callable[[Any], str]]],
    *,
    warn: Callable[[dict[str, Any]], bool] | None = None,
) -> str:
    """An HTML table; text columns (formatted with :func:`esc`) left-aligned, numbers right."""
    if not rows:
        return '<p class="muted">none</p>'
    align = ["l" if fmt is esc or fmt is _html else "" for _, _, fmt in cols]
    head = "".join(f'<th class="{a}">{esc(title)}</th>' for a, (_, title, _) in zip(align, cols))
    body = []
    for r in rows:
        cls = ' class="warn"' if warn is not None and warn(r) else ""
        cells = "".join(
            f'<td class="{a}">{fmt(r.get(key))}</td>' for a, (key, _, fmt) in zip(align, cols)
        )
        body.append(f"<tr{cls}>{cells}</tr>")
    return (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
        "</tbody></table></div>"
    )


def _dense(
    rows: list[dict[str, Any]], step: float, t_last: float = math.inf
) -> dict[str, list[float]]:
    """Sparse bucket rows of one queue filled in: counts 0, held figures carried, age grown.
    Rates in the bucket holding ``t_last`` (the journal's end) are over its covered part."""
    out: dict[str, list[float]] = {
        k: [] for k in ("t", "published", "acked", "messages", "oldest_age")
    }
    prev: dict[str, Any] | None = None
    for r in rows:
        if prev is not None:
            for b in range(prev["bucket"] + 1, r["bucket"]):
                gap = (b - prev["bucket"]) * step
                out["t"].append(prev["t"] + gap)
                out["published"].append(0.0)
                out["acked"].append(0.0)
                out["messages"].append(prev["messages"])
                out["oldest_age"].append(prev["oldest_age"] + gap if prev["messages"] else 0.0)
        out["t"].append(r["t"])
        width = min(step, max(t_last - (r["t"] - step), step / 100))
        out["published"].append((r["published"] or 0) / width)
        out["acked"].append((r["acked"] or 0) / width)
        out["messages"].append(float(r["messages"] or 0))
        out["oldest_age"].append(float(r["oldest_age"] or 0.0))
        prev = r
    return out


def render(
    *,
    journal: str,
    overview: dict[str, Any],
    queues: list[dict[str, Any]],
    consumers: list[dict[str, Any]],
    series: list[dict[str, Any]],
    histograms: list[dict[str, Any]],
    busiest: list[tuple[str, str]],
    dead_letters: list[dict[str, Any]],
    redeliveries: list[dict[str, Any]],
    actions: list[dict[str, Any]],
    step: float,
    t0: float,
    t1: float,
    bindings: dict[tuple[str, str], list[tuple[str, str]]] | None = None,
) -> str:
    """The page. ``bindings``: each queue's ``(exchange, binding key)`` pairs, which label a
    server-named subscription queue (``stocks.us.ibm on amq.topic``) where its name
    (``amq.gen-...``) would tell an operator nothing."""
    ov = overview
    bindings = bindings or {}
    by = ov["by_event"]
    lat = ov.get("latency") or {}
    n_cons = len(consumers)
    cards = [
        (fmt_num(ov["events"]), "events"),
        (fmt_num(ov["queues"]), "queues"),
        (fmt_num(n_cons), "consumers"),
        (fmt_num(by.get("published", 0)), "published (per queue)"),
        (fmt_num(by.get("acked", 0)), "acked"),
        (fmt_num(by.get("redelivered", 0)), "redelivered"),
        (fmt_num(by.get("dead_lettered", 0)), "dead-lettered"),
        (fmt_num(by.get("policy_action", 0)), "policy actions"),
        (
            f"{fmt_dur(lat.get('latency_p50'))} / {fmt_dur(lat.get('latency_p99'))}",
            "processing time p50 / p99",
        ),
    ]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>plugbroker report: {esc(journal)}</title><style>{CSS}</style></head><body>",
        "<header><h1>plugbroker journal report</h1>",
        (
            f"<p>{esc(journal)} · {fmt_time(ov['start'], True)} to {fmt_time(ov['end'], True)} "
            f"({fmt_dur(ov['end'] - ov['start'])}) · {len(ov['runs'])} broker run(s) · "
            f"schema version {ov['schema_version']} · buckets of {fmt_dur(step)}</p>"
            "</header><main>"
        ),
    ]
    if ov.get("dropped"):
        parts.append(
            f"<p class='warn'><b>{ov['dropped']:,} events were dropped</b> by the "
            "journal writer (its buffer was full): counts below are lower bounds.</p>"
        )
    parts.append(
        "<div class='cards'>"
        + "".join(f"<div class='card'><b>{v}</b><span>{esc(k)}</span></div>" for v, k in cards)
        + "</div>"
    )

    # -- busiest queues with plots
    parts.append(f"<h2>Busiest queues ({len(busiest)})</h2>")
    by_queue: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in series:
        by_queue.setdefault((r["vhost"], r["queue"]), []).append(r)
    hist_by: dict[tuple[str, str], dict[int, int]] = {}
    for h in histograms:
        hist_by.setdefault((h["vhost"], h["queue"]), {})[h["bucket"]] = h["count"]
    qinfo = {(q["vhost"], q["queue"]): q for q in queues}
    nb = len(LATENCY_BOUNDS) + 1
    for key in busiest:
        q = qinfo.get(key, {})
        d = _dense(sorted(by_queue.get(key, []), key=lambda r: r["bucket"]), step, t1)
        hist = hist_by.get(key, {})
        lo = min(hist, default=0)
        hi = max(hist, default=0)
        idx = list(range(lo, hi + 1))
        vhost = "" if key[0] == "/" else f" (vhost {key[0]})"
        bound = bindings.get(key)
        if bound and key[1].startswith("amq.gen-"):
            heading = (
                f"{esc(subscription_label(bound))}{esc(vhost)}"
                f"<span class='sub'>subscription queue {esc(key[1])}</span>"
            )
        else:
            heading = f"{esc(key[1])}{esc(vhost)}"
            if bound:
                heading += f"<span class='sub'>bound to {esc(subscription_label(bound))}</span>"
        facts = (
            f"published {fmt_num(q.get('published'))} · acked {fmt_num(q.get('acked'))} · "
            f"rejected {fmt_num(q.get('rejected'))} · redelivered "
            f"{fmt_num(q.get('redelivered'))} · dead-lettered "
            f"{fmt_num(q.get('dead_lettered'))} · ack rate {fmt_num(q.get('ack_rate'))}/s "
            f"(peak {fmt_num(q.get('peak_ack_rate'))}/s) · processing p50/p95/p99 "
            f"{fmt_dur(q.get('latency_p50'))} / {fmt_dur(q.get('latency_p95'))} / "
            f"{fmt_dur(q.get('latency_p99'))} · max backlog "
            f"{fmt_num(q.get('max_messages'))} msgs ({fmt_bytes(q.get('max_bytes'))}), "
            f"oldest {fmt_dur(q.get('max_oldest_age'))}"
        )
        parts.append(
            f"<div class='queue'><h3>{heading}</h3>"
            f"<div class='facts'>{facts}</div><div class='plots'>"
        )
        xlim = (t0, t0 + math.ceil((t1 - t0) / step) * step)
        parts.append(
            line_chart(
                "throughput (msg/s)",
                d["t"],
                [("published", d["published"]), ("acked", d["acked"])],
                xlim=xlim,
            )
        )
        parts.append(
            line_chart("backlog (messages held)", d["t"], [("held", d["messages"])], xlim=xlim)
        )
        parts.append(
            line_chart(
                "oldest message age", d["t"], [("age", d["oldest_age"])], y_fmt=fmt_dur, xlim=xlim
            )
        )
        parts.append(
            bar_chart(
                "processing time (delivery → ack), upper bounds",
                [short_label(i) for i in idx],
                [float(hist.get(i, 0)) for i in idx],
                highlight=[j for j, i in enumerate(idx) if i >= nb - 4],
            )
        )
        parts.append("</div></div>")

    # -- tables
    def labelled(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {**r, "queue_html": queue_cell(r.get("vhost") or "/", r["queue"], bindings)}
            if r.get("queue") is not None
            else r
            for r in rows
        ]

    # a message event no queue ever had is left out of the page's table (not of the CSV)
    events_seen = [e for e in MESSAGE_EVENTS if any(q.get(e) for q in queues)]
    multi_vhost = len({q.get("vhost") for q in queues}) > 1
    qcols: list[tuple[str, str, Callable[[Any], str]]] = [
        *([("vhost", "vhost", esc)] if multi_vhost else []),
        ("queue_html", "queue", _html),
        *[(e, e.replace("_", " "), fmt_num) for e in events_seen],
        ("ack_rate", "acks/s", fmt_num),
        ("peak_ack_rate", "peak acks/s", fmt_num),
        ("latency_p50", "p50", fmt_dur),
        ("latency_p95", "p95", fmt_dur),
        ("latency_p99", "p99", fmt_dur),
        ("max_messages", "max held", fmt_num),
        ("max_bytes", "max bytes", fmt_bytes),
        ("max_oldest_age", "max age", fmt_dur),
    ]
    parts.append(f"<h2>Queues ({len(queues)})</h2>")
    if not multi_vhost and queues:
        parts.append(f"<p class='muted'>All in vhost {esc(queues[0].get('vhost'))}.</p>")
    parts.append(_table(labelled(queues), qcols))
    ccols: list[tuple[str, str, Callable[[Any], str]]] = [
        ("queue_html", "queue", _html),
        ("consumer_tag", "consumer", esc),
        ("connection_id", "connection", esc),
        ("delivered", "delivered", fmt_num),
        ("acked", "acked", fmt_num),
        ("rejected", "rejected", fmt_num),
        ("requeued", "requeued", fmt_num),
        ("ack_rate", "acks/s", fmt_num),
        ("latency_p50", "p50", fmt_dur),
        ("latency_p95", "p95", fmt_dur),
        ("latency_p99", "p99", fmt_dur),
        ("latency_max", "max", fmt_dur),
        ("isolated", "isolated", fmt_num),
        ("last_ack_ts", "last ack", fmt_time),
        ("removed_reason", "left because", esc),
    ]
    parts.append(f"<h2>Consumers ({len(consumers)})</h2>")
    parts.append("<p class='muted'>Highlighted: isolated, or given messages it never settled.</p>")
    parts.append(
        _table(
            labelled(consumers),
            ccols,
            warn=lambda r: (
                bool(r.get("isolated"))
                or ((r.get("delivered") or 0) > 0 and not (r.get("acked") or r.get("rejected")))
            ),
        )
    )

    parts.append("<h2>Dead letters and drops by reason</h2><div class='plots'>")
    reasons: dict[str, float] = {}
    for r in dead_letters:
        k = f"{r['outcome'].replace('_', '-')} ({r['reason']})"
        reasons[k] = reasons.get(k, 0) + r["count"]
    if reasons:
        parts.append(
            hbar_chart(
                "messages by fate and reason",
                list(reasons),
                list(reasons.values()),
                color=PALETTE[1],
            )
        )
    parts.append("</div>")
    parts.append(_legend(FATES))
    parts.append(
        _table(
            labelled(dead_letters),
            [
                ("vhost", "vhost", esc),
                ("queue_html", "queue", _html),
                ("outcome", "outcome", esc),
                ("reason", "reason", esc),
                ("count", "messages", fmt_num),
            ],
        )
    )
    parts.append("<h2>Redeliveries by reason</h2>")
    parts.append(
        _table(
            labelled(redeliveries),
            [
                ("vhost", "vhost", esc),
                ("queue_html", "queue", _html),
                ("reason", "reason", esc),
                ("count", "messages", fmt_num),
            ],
        )
    )
    parts.append(f"<h2>Policy actions ({len(actions)})</h2>")
    parts.append(
        "<p class='muted'>What each policy asked for, and its <b>outcome</b>: what the core "
        "did about it.</p>"
    )
    parts.append(_legend(OUTCOMES))
    parts.append(
        _table(
            labelled(actions),
            [
                ("ts", "time", fmt_time),
                ("event", "event", esc),
                ("queue_html", "queue", _html),
                ("policy", "policy", esc),
                ("action", "action", esc),
                ("consumer_tag", "consumer", esc),
                ("threshold", "threshold", esc),
                ("configured", "configured", fmt_num),
                ("measured", "measured", fmt_num),
                ("outcome", "outcome", esc),
                ("reason", "reason", esc),
            ],
        )
    )
    parts.append(
        "</main><footer>Generated by <code>plugbroker analyze report</code>. Every "
        "table is also in <code>tables/</code> (Parquet) and <code>csv/</code>. "
        "Times are UTC; processing time is the time from a delivery to the ack or "
        "reject of it on the same channel.</footer></body></html>"
    )
    return "".join(parts)
