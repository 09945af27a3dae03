"""The timeline picture of one explained key: a lane per replica, a span per version (matplotlib, offline).

Each lane (top to bottom in the document's replica order) shows the key's versions as spans
from one version to the next (⊥ from the axis start), coloured by value (equal hashes, equal
colours; TOMBSTONE grey and hatched, ABSENT white with a dashed edge), each labelled with its
offset. The witness versions of every proven pair get a thick red edge and a ``v``/``w``
marker; gaps are hatched grey; heartbeats are ticks on the lane's bottom edge. The x axis is
the source write time when every data version has one and it never goes back along a
replica's offsets, else the offset in each replica's own version topic.

The SVG keeps ids a browser test can find (``lane_id``, ``witness_id``, ``gap_id``, prefixed
with ``prefix`` when several pictures share a page), keeps text as text and is the same bytes
for the same document. Only ``matplotlib.figure.Figure`` is used (no pyplot: no global
figure state), imported when a picture is drawn, so importing this module costs nothing.
"""
from __future__ import annotations

import io
import re
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Iterator, Optional

from explain.document import worst_verdict
from explain.text import NO_VERSIONS, pieces, shown

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WIDTH_PX, DPI = 900, 80  # png(doc) at its default dpi is WIDTH_PX wide
HEADER_PX, LANE_PX, FOOTER_PX, TITLE_LINE_PX = 50, 70, 70, 14
TITLE_CHARS, TITLE_LINES = 110, 3
SPAN_LOW, SPAN_HIGH = 0.22, 0.78  # a span's height inside its lane (a lane is 1 high)
TICK_LOW, TICK_HIGH = 0.04, 0.18  # heartbeat ticks, under the spans
LEFT_ROOM, RIGHT_ROOM = 0.08, 0.12  # the axis extends these shares of the data range (room for ⊥, the last span)
GAP_SHARE = 0.012  # the width of a gap band on the time axis, and the least width of a gap on the offset axis
LABEL_PT = 7
WITNESS_RED = "#d62728"
TOMBSTONE_GREY = "#c7c7c7"
GAP_GREY = "#9a9a9a"
LANE_BACKGROUND = "#f4f4f4"
# tab20 without its greys (taken by TOMBSTONE) and reds (taken by the witness edge).
PALETTE = (
    "#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#9467bd", "#c5b0d5",
    "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#bcbd22", "#dbdb8d", "#17becf", "#9edae5",
)
STYLE = {
    "svg.fonttype": "none",  # text stays text: small, searchable
    "font.size": 8,
    "font.family": "DejaVu Sans",
}
MS_PER_DAY = 86_400_000
TIME_LABEL = "source write time (UTC)"
OFFSET_LABEL = "offset in each replica's version topic"
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")


# ------------------------------------------------------------------ the ids a page or a test looks for
def _id_part(text: str) -> str:
    return _UNSAFE_ID.sub("_", text)


def lane_id(replica: str, prefix: str = "") -> str:
    return f"{prefix}lane-{_id_part(replica)}"


def witness_id(replica: str, offset: Optional[int], prefix: str = "") -> str:
    return f"{prefix}witness-{_id_part(replica)}-{'bottom' if offset is None else offset}"


def gap_id(replica: str, n: int, prefix: str = "") -> str:
    return f"{prefix}gap-{_id_part(replica)}-{n}"


def label_id(replica: str, offset: Optional[int], prefix: str = "") -> str:
    """A version's offset label inside its span (``witness_label_id``: the witness's own label above it)."""
    return f"{prefix}label-{_id_part(replica)}-{'bottom' if offset is None else offset}"


def span_id(replica: str, offset: Optional[int], prefix: str = "") -> str:
    return f"{prefix}span-{_id_part(replica)}-{'bottom' if offset is None else offset}"


def witness_label_id(replica: str, offset: Optional[int], prefix: str = "") -> str:
    return f"{prefix}mark-{_id_part(replica)}-{'bottom' if offset is None else offset}"


# ------------------------------------------------------------------ what goes where
def _data_versions(replica: dict) -> list[dict]:
    return [v for v in replica["versions"] if v["offset"] is not None]


def uses_time_axis(doc: dict) -> bool:
    """Every data version has a write time, and write times never go back along any replica's offsets."""
    lanes = [[v["write_ms"] for v in _data_versions(r)] for r in doc["replicas"]]
    if not any(lanes) or any(ms is None for lane in lanes for ms in lane):
        return False
    return all(a <= b for lane in lanes for a, b in zip(lane, lane[1:]))


def _colours(doc: dict) -> dict[str, str]:
    """Each PUT value hash -> a palette colour, in order of first appearance (equal values, equal colours)."""
    hashes = dict.fromkeys(v["value_hash"] for r in doc["replicas"] for v in r["versions"] if v["kind"] == "PUT")
    return {h: PALETTE[i % len(PALETTE)] for i, h in enumerate(hashes)}


def _witnesses(doc: dict) -> dict[tuple[str, Optional[int]], str]:
    """(replica, offset) -> its marker: "v", "w" or "v w" (a version can witness several pairs)."""
    marks: dict[tuple[str, Optional[int]], list[str]] = {}
    for pair in doc["pairs"]:
        if pair["witness"] is not None:
            for role, name, offset in (("v", pair["replica_a"], pair["witness"]["offset_a"]),
                                       ("w", pair["replica_b"], pair["witness"]["offset_b"])):
                if role not in marks.setdefault((name, offset), []):
                    marks[(name, offset)].append(role)
    return {k: " ".join(sorted(v)) for k, v in marks.items()}


class _Axis:
    """Where a version, a heartbeat and the axis ends lie on x (days for the time axis, offsets otherwise)."""

    def __init__(self, doc: dict):
        self.time = uses_time_axis(doc)
        self.zero = _epoch_days() if self.time else 0.0
        xs = [self.of(v) for r in doc["replicas"] for v in _data_versions(r)]
        low, high = (min(xs), max(xs)) if xs else (0.0, 1.0)
        span = (high - low) or (1000 / MS_PER_DAY if self.time else 10)  # one second, or ten offsets
        self.start, self.end = low - LEFT_ROOM * span, high + RIGHT_ROOM * span
        self.gap_width = GAP_SHARE * (self.end - self.start)

    def of(self, version: dict) -> float:
        return self.zero + version["write_ms"] / MS_PER_DAY if self.time else float(version["offset"])

    def of_heartbeat(self, beat: dict) -> float:
        return self.zero + beat["applied_ms"] / MS_PER_DAY if self.time else float(beat["offset"])


def _epoch_days() -> float:
    """Where 1970-01-01 UTC lies on matplotlib's date axis (days since its epoch setting)."""
    from matplotlib.dates import date2num

    return float(date2num(datetime(1970, 1, 1, tzinfo=timezone.utc)))


def _spans(replica: dict, axis: _Axis) -> list[tuple[dict, float, float]]:
    """(version, x from, x to) per version: to the next version, the last to the axis end, ⊥ from the axis start."""
    versions = replica["versions"]
    starts = [axis.start if v["offset"] is None else axis.of(v) for v in versions]
    ends = starts[1:] + [axis.end]
    return list(zip(versions, starts, ends))


def _gap_bands(replica: dict, axis: _Axis, spans: list[tuple[dict, float, float]]) -> list[tuple[int, float, float]]:
    """(n, x from, x to) of the gaps in a lane.

    Offset axis: every gap range of the dump inside the axis, exactly (at least ``gap_width`` wide
    to stay visible), numbered as in ``dump.gap_ranges``. Time axis (a gap has no time): a band at
    each version boundary a gap lies in (the earlier version's ``gap_after``), and before a first
    version with ``gap_before`` that no ⊥ precedes, numbered left to right.
    """
    if not axis.time:
        bands = []
        for n, gap in enumerate(replica["dump"]["gap_ranges"]):
            low, high = gap["first"] - 0.5, gap["last"] + 0.5
            if high >= axis.start and low <= axis.end:
                middle, width = (low + high) / 2, max(high - low, axis.gap_width)
                bands.append((n, middle - width / 2, middle + width / 2))
        return bands
    edges = []
    if spans and spans[0][0]["offset"] is not None and spans[0][0]["gap_before"]:
        edges.append(spans[0][1] - axis.gap_width)
    for version, _, end in spans:
        if version["gap_after"]:
            edges.append(min(end, axis.end - axis.gap_width / 2) - axis.gap_width / 2)
    return [(n, x, x + axis.gap_width) for n, x in enumerate(edges)]


# ------------------------------------------------------------------ drawing
def _span_style(version: dict, colours: dict[str, str]) -> dict:
    if version["kind"] == "ABSENT":
        return {"facecolor": "white", "edgecolor": "#8c8c8c", "linestyle": "--", "linewidth": 0.8}
    if version["kind"] == "DELETE":
        return {"facecolor": TOMBSTONE_GREY, "edgecolor": "#6f6f6f", "hatch": "////", "linewidth": 0.6}
    return {"facecolor": colours[version["value_hash"]], "edgecolor": "white", "linewidth": 0.6}


def _label(version: dict) -> str:
    return "⊥" if version["offset"] is None else str(version["offset"])


def _draw_lane(ax: "Axes", doc: dict, i: int, axis: _Axis, colours: dict, marks: dict, px_per_x: float,
               prefix: str) -> list[tuple]:
    """Draw one lane; return its (label, span) pairs: each version's offset label, kept only if it fits its span
    (``_fit_labels``, once the figure can measure text)."""
    from matplotlib.patches import Rectangle

    replica = doc["replicas"][i]
    name = replica["replica"]
    base = len(doc["replicas"]) - 1 - i  # the first replica on top
    background = Rectangle((axis.start, base + 0.02), axis.end - axis.start, 0.96, facecolor=LANE_BACKGROUND,
                           edgecolor="none", zorder=0)
    background.set_gid(lane_id(name, prefix))
    ax.add_artist(background)
    spans = _spans(replica, axis)
    if not spans:
        ax.text((axis.start + axis.end) / 2, base + 0.5, NO_VERSIONS, fontsize=LABEL_PT, ha="center", va="center",
                color="#555555")
    labels = []
    for version, start, end in spans:
        key = (name, version["offset"])
        span = Rectangle((start, base + SPAN_LOW), end - start, SPAN_HIGH - SPAN_LOW, zorder=2,
                         **_span_style(version, colours))
        span.set_gid(span_id(name, version["offset"], prefix))
        ax.add_artist(span)
        if key in marks:  # the witness's own label, above its span: always shown
            span.set(edgecolor=WITNESS_RED, linewidth=2.4, linestyle="-", zorder=4)
            span.set_gid(witness_id(name, version["offset"], prefix))
            ax.text(start, base + SPAN_HIGH + 0.03, f"{marks[key]}: {_label(version)}", color=WITNESS_RED,
                    fontsize=9, fontweight="bold", ha="left", va="bottom", zorder=5,
                    gid=witness_label_id(name, version["offset"], prefix))
        label = ax.text(start, base + 0.5, f" {_label(version)}", fontsize=LABEL_PT, ha="left", va="center",
                        zorder=6, clip_on=True, gid=label_id(name, version["offset"], prefix))
        labels.append((label, span))
    for n, low, high in _gap_bands(replica, axis, spans):
        band = Rectangle((low, base + 0.06), high - low, 0.88, facecolor="none", edgecolor=GAP_GREY, hatch="xx",
                         linewidth=0.4, zorder=3)
        band.set_gid(gap_id(name, n, prefix))
        ax.add_artist(band)
    beats = [x for x in map(axis.of_heartbeat, replica.get("heartbeats", [])) if axis.start <= x <= axis.end]
    if beats:  # one path of all the ticks: one SVG element however many heartbeats
        xs = [x for beat in beats for x in (beat, beat, float("nan"))]
        ys = [base + TICK_LOW, base + TICK_HIGH, float("nan")] * len(beats)
        ax.plot(xs, ys, color="#404040", linewidth=0.7, zorder=3, gid=f"{prefix}heartbeats-{_id_part(name)}")
    return labels


def _fit_labels(fig: "Figure", labels: list[tuple]) -> None:
    """Remove every offset label that does not fit inside its own span, measured by the figure's renderer (a narrow
    span's label would otherwise spill onto the next span and read as that one's offset). The witnesses keep their
    own labels above their spans; the span stays, and its offset is in the text beside the picture."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    for label, span in labels:
        text, box = label.get_window_extent(renderer), span.get_window_extent(renderer)
        if text.x0 < box.x0 - 0.5 or text.x1 > box.x1 - 1:
            label.remove()


def _legend(fig: "Figure") -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=PALETTE[0], label="value (equal colour: equal value)"),
        Patch(facecolor=TOMBSTONE_GREY, edgecolor="#6f6f6f", hatch="////", label="TOMBSTONE"),
        Patch(facecolor="white", edgecolor="#8c8c8c", linestyle="--", label="ABSENT (⊥)"),
        Patch(facecolor="white", edgecolor=WITNESS_RED, linewidth=2.4, label="witness v / w"),
        Patch(facecolor="none", edgecolor=GAP_GREY, hatch="xxxx", label="gap"),
        Line2D([], [], color="#404040", marker="|", linestyle="none", markersize=8, label="heartbeat"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=7,
               handlelength=1.6, columnspacing=1.4, borderaxespad=0.4)


def _title(doc: dict) -> list[str]:
    """The key (up to TITLE_LINES lines: the page and the text beside the picture show it whole), then the rest."""
    lines = pieces(shown(doc["key"]), TITLE_CHARS)
    if len(lines) > TITLE_LINES:
        lines = lines[:TITLE_LINES - 1] + [lines[TITLE_LINES - 1][:-1] + "…"]
    return lines + [f"{doc['topic']}/{doc['partition']} · snapshot {doc['snapshot_id']} · {worst_verdict(doc)}"]


def _clock_format(axis: _Axis) -> str:
    """Clock times to the unit the axis needs: milliseconds when it spans under a minute, seconds under a day."""
    span_ms = (axis.end - axis.start) * MS_PER_DAY
    return "%H:%M:%S.%f" if span_ms < 60_000 else "%H:%M:%S" if span_ms < MS_PER_DAY else "%Y-%m-%d %H:%M"


def _time_ticks(ax: "Axes", axis: _Axis) -> None:
    """Ticks as UTC clock times (``HH:MM:SS``, with milliseconds on a short axis): each says its own unit."""
    from matplotlib.dates import AutoDateLocator, DateFormatter
    from matplotlib.ticker import FuncFormatter

    locator = AutoDateLocator(minticks=4, maxticks=7, tz=timezone.utc)
    ax.xaxis.set_major_locator(locator)
    form = _clock_format(axis)
    plain = DateFormatter(form, tz=timezone.utc)
    # %f is microseconds: cut to milliseconds.
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, pos: plain(x, pos)[:-3]) if form.endswith("%f") else plain)


def _time_label(ax: "Axes", axis: _Axis) -> str:
    """The axis title with its unit: the date (UTC) and how the ticks read, e.g. ``source write time, UTC clock
    time (hh:mm:ss.mmm) on 2023-11-14``."""
    from matplotlib.dates import num2date

    form = _clock_format(axis)
    if form.startswith("%Y"):
        return f"{TIME_LABEL}: date and time (yyyy-mm-dd hh:mm)"
    first, last = (num2date(x, tz=timezone.utc).strftime("%Y-%m-%d") for x in (axis.start, axis.end))
    day = first if first == last else f"{first} to {last}"
    unit = "hh:mm:ss.mmm" if form.endswith("%f") else "hh:mm:ss"
    return f"{TIME_LABEL}: clock time ({unit}) on {day}"


def figure(doc: dict, prefix: str = "") -> "Figure":
    """The timeline of one key: ~900 x (120 + 70 per replica) px at ``DPI``; ids prefixed with ``prefix``."""
    with _style(prefix):
        return _figure(doc, prefix)


def _figure(doc: dict, prefix: str) -> "Figure":
    from matplotlib.figure import Figure

    lanes = len(doc["replicas"])
    title = _title(doc)
    header = HEADER_PX + TITLE_LINE_PX * (len(title) - 2)
    height = header + LANE_PX * max(lanes, 1) + FOOTER_PX
    fig = Figure(figsize=(WIDTH_PX / DPI, height / DPI), dpi=DPI)
    names = [r["replica"] for r in doc["replicas"]]
    left = min(0.3, (14 + 6 * max((len(n) for n in names), default=4)) / WIDTH_PX)
    right = 0.985
    ax = fig.add_axes((left, FOOTER_PX / height, right - left, LANE_PX * max(lanes, 1) / height))
    axis = _Axis(doc)
    px_per_x = WIDTH_PX * (right - left) / (axis.end - axis.start)
    colours, marks = _colours(doc), _witnesses(doc)
    labels = []
    for i in range(lanes):
        labels += _draw_lane(ax, doc, i, axis, colours, marks, px_per_x, prefix)
    ax.set_xlim(axis.start, axis.end)
    ax.set_ylim(0, max(lanes, 1))
    ax.set_yticks([lanes - 1 - i + 0.5 for i in range(lanes)])
    ax.set_yticklabels(names, parse_math=False)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    if axis.time:
        _time_ticks(ax, axis)
    ax.set_xlabel(_time_label(ax, axis) if axis.time else OFFSET_LABEL, fontsize=8, labelpad=2)
    fig.text(0.5, 1 - 8 / height, "\n".join(title), ha="center", va="top", fontsize=9, linespacing=1.25,
             parse_math=False)
    _legend(fig)
    _fit_labels(fig, labels)  # once the axes, title and legend are laid out
    return fig


@contextmanager
def _style(prefix: str) -> Iterator[None]:
    """The settings of a picture, for drawing and saving it (rc_context: nothing global stays changed)."""
    import matplotlib

    with matplotlib.rc_context({**STYLE, "svg.hashsalt": f"replica-lens-{prefix}", "svg.id": f"{prefix}timeline"}):
        yield


def svg(doc: dict, prefix: str = "") -> str:
    """The picture as an ``<svg>`` element to inline in HTML (no XML prolog, no doctype); the same for the same doc."""
    out = io.StringIO()
    with _style(prefix):
        figure(doc, prefix).savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    text = out.getvalue()
    return text[text.index("<svg"):]


def png(doc: dict, dpi: int = DPI) -> bytes:
    """The picture as PNG bytes (``WIDTH_PX`` wide at the default ``dpi``)."""
    out = io.BytesIO()
    with _style(""):
        figure(doc).savefig(out, format="png", dpi=dpi, metadata={"Software": None})
    return out.getvalue()
