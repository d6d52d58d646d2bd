"""Inline SVG charts (no chart library): depth over time as step lines, flow as bars.

Only numbers are computed here; the templates write the SVG, escaping every label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pawn_queue.dashboard.views import FlowPoint, Point

WIDTH = 640
HEIGHT = 140
_TOP = 8
_BUCKETS = 30
MIN_SPAN = 60.0  # a young dashboard's charts still span a minute


@dataclass(frozen=True, slots=True)
class Line:
    name: str
    css: str
    points: str  # "x,y x,y ..." for <polyline>
    last: int


@dataclass(frozen=True, slots=True)
class Bar:
    css: str
    x: float
    y: float
    width: float
    height: float
    title: str


@dataclass(frozen=True, slots=True)
class Chart:
    """What a template needs to draw one chart."""

    lines: list[Line]
    bars: list[Bar]
    y_max: float
    span_seconds: float
    bucket_seconds: float = 0.0
    legend: tuple[tuple[str, str], ...] = ()  # (css class, label) for bar charts
    width: int = WIDTH
    height: int = HEIGHT


_DEPTH = (
    ("pending", "pending"),
    ("in_flight", "in flight"),
    ("delayed", "delayed"),
    ("dead_letter", "dead letters"),
)


def depth_chart(points: Sequence[Point], now: float, span: float) -> Chart | None:
    """Counts over the last ``span`` seconds (each read's counts hold until the next)."""
    if not points:
        return None
    start = max(min(points[0].at, now - MIN_SPAN), now - span)
    width = max(now - start, 1.0)
    shown = [p for p in points if p.at >= start]
    before = [p for p in points if p.at < start]
    if before:
        shown.insert(0, before[-1])
    y_max: int = max(1, *(int(getattr(p, field)) for p in shown for field, _ in _DEPTH))

    def x(at: float) -> float:
        return round((max(at, start) - start) / width * WIDTH, 1)

    def y(value: int) -> float:
        return round(HEIGHT - value / y_max * (HEIGHT - _TOP), 1)

    lines = []
    for field, label in _DEPTH:
        coords: list[str] = []
        for index, point in enumerate(shown):
            value = getattr(point, field)
            if index:
                coords.append(f"{x(point.at)},{y(getattr(shown[index - 1], field))}")
            coords.append(f"{x(point.at)},{y(value)}")
        coords.append(f"{WIDTH},{y(getattr(shown[-1], field))}")
        lines.append(
            Line(label, field.replace("_", "-"), " ".join(coords), getattr(shown[-1], field))
        )
    return Chart(lines, [], y_max, width)


def flow_chart(points: Sequence[Point], now: float, span: float) -> Chart | None:
    """Objects published and settled per interval, from successive reads."""
    series = [(p.at, (float(p.published), float(p.settled))) for p in list(points)[1:]]
    return _bars(series, now, span, (("published", "published"), ("settled", "settled")))


def metrics_chart(points: Sequence[FlowPoint], now: float, span: float) -> Chart | None:
    """Messages published, acked and dead-lettered per interval, from the exporters."""
    series = [(p.at, (p.published, p.acked, p.dead_lettered)) for p in points]
    legend = (("published", "published"), ("settled", "acked"), ("dead", "dead-lettered"))
    return _bars(series, now, span, legend)


def _bars(
    series: Sequence[tuple[float, tuple[float, ...]]],
    now: float,
    span: float,
    legend: tuple[tuple[str, str], ...],
) -> Chart | None:
    if not series:
        return None
    start = max(min(min(at for at, _ in series), now - MIN_SPAN), now - span)
    width = max(now - start, 1.0)
    bucket = width / _BUCKETS
    sums = [[0.0] * len(legend) for _ in range(_BUCKETS)]
    for at, values in series:
        if at < start:
            continue
        index = min(int((at - start) / bucket), _BUCKETS - 1)
        for k, value in enumerate(values):
            sums[index][k] += value
    y_max = max(1.0, *(v for row in sums for v in row))
    slot = WIDTH / _BUCKETS
    bar_width = (slot - 2) / len(legend)
    bars = []
    for index, row in enumerate(sums):
        for k, value in enumerate(row):
            if not value:
                continue
            height = round(value / y_max * (HEIGHT - _TOP), 1)
            bars.append(
                Bar(
                    css=legend[k][0],
                    x=round(index * slot + 1 + k * bar_width, 1),
                    y=round(HEIGHT - height, 1),
                    width=round(bar_width, 1),
                    height=height,
                    title=f"{legend[k][1]}: {value:g}",
                )
            )
    return Chart([], bars, y_max, width, bucket_seconds=bucket, legend=legend)
