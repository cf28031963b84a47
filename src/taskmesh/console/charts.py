"""Small line charts drawn on the server as inline SVG (no script, no library: the CSP allows no inline script,
and SVG drawn from numbers alone cannot carry markup).

A chart is built from the points of ``GET /api/v1/history``: each line is one field, scaled to the
largest value of the chart; a step with no value (``None``) breaks the line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

WIDTH, HEIGHT = 600, 120
"""The charts' viewBox, in SVG units (the CSS scales it to the card)."""


@dataclass(frozen=True)
class Line:
    """One series: its label and CSS class; its polyline segments (``"x,y x,y ..."``) and lone dots over the
    full steps; the step still going (a dashed segment from the last full step, ``""`` when that has no
    value, and a dot); its latest value in words."""

    label: str
    css: str
    segments: list[str]
    dots: list[tuple[str, str]]
    now_segment: str
    now_dot: tuple[str, str] | None
    latest: str


@dataclass(frozen=True)
class Chart:
    """A chart: its title, the top of its scale in words, its lines, and the span's ends in words."""

    title: str
    top: str
    lines: list[Line]
    first_at: str
    last_at: str
    empty: bool


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten that is at least ``value`` (1 for 0)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 2.5, 5, 10):
        if value <= m * power:
            return float(m * power)
    return float(10 * power)


def draw(
    points: Sequence[dict[str, Any]],
    title: str,
    series: Sequence[tuple[str, str, str]],
    unit: str,
    seconds: bool = False,
    dated: bool = False,
) -> Chart:
    """A chart of ``series`` (``(label, field, css class)``) over ``points``, oldest first.

    The last point is the step still going: it is drawn at the right edge, dashed from the last
    full step (its count is partial, so a solid line there would read as a real dip), and its value
    is also given in words (``latest``).

    :param unit: what a value counts (singular: "run", "task"); with ``seconds``, values are durations.
    :param dated: the span's ends carry their day and month (a span longer than a day's part).
    """
    values = [p[field] for p in points for _, field, _ in series if p[field] is not None]
    top = nice_ceiling(max(values, default=0))
    n = max(len(points) - 1, 1)

    def xy(i: int, v: float) -> str:
        return f"{i * WIDTH / n:.1f},{HEIGHT - (v / top) * (HEIGHT - 4) - 2:.1f}"

    lines = []
    for label, field, css in series:
        segments: list[str] = []
        current: list[str] = []
        for i, p in enumerate(points[:-1]):
            if p[field] is None:
                if current:
                    segments.append(" ".join(current))
                current = []
                continue
            current.append(xy(i, p[field]))
        if current:
            segments.append(" ".join(current))
        lone = [(s.split(",")[0], s.split(",")[1]) for s in segments if " " not in s]  # between gaps: a dot
        latest = points[-1][field] if points else None
        now_dot, now_segment = None, ""
        if latest is not None:
            end = xy(len(points) - 1, latest)
            now_dot = (end.split(",")[0], end.split(",")[1])
            before = points[-2][field] if len(points) > 1 else None
            if before is not None:
                now_segment = f"{xy(len(points) - 2, before)} {end}"
        lines.append(
            Line(
                label,
                css,
                [s for s in segments if " " in s],
                lone,
                now_segment,
                now_dot,
                format_value(latest, unit, seconds),
            )
        )
    return Chart(
        title=title,
        top=format_value(top, unit, seconds),
        lines=lines,
        first_at=_moment(points[0]["at"], dated) if points else "",
        last_at=_moment(points[-1]["at"], dated) if points else "",
        empty=not values,
    )


def _moment(at: str, dated: bool) -> str:
    """An ISO 8601 instant of the axis in words: ``"14:05"``, or ``"4 Dec 14:05"`` when ``dated``."""
    moment = datetime.fromisoformat(at)
    return f"{moment.day} {moment:%b %H:%M}" if dated else f"{moment:%H:%M}"


def format_value(value: float | None, unit: str, seconds: bool = False) -> str:
    """``value`` in words: ``"1,200 runs"`` (``unit`` is singular: ``"run"``), ``"250 ms"``, ``"3.5 min"``;
    ``"–"`` for ``None``."""
    if value is None:
        return "–"
    if seconds:
        if value < 1:
            return f"{value * 1000:,.0f} ms"
        if value < 120:
            return f"{value:,.1f} s".replace(".0 s", " s")
        if value < 7200:
            return f"{value / 60:,.1f} min".replace(".0 min", " min")
        return f"{value / 3600:,.1f} h".replace(".0 h", " h")
    return f"{value:,.0f} {unit}{'' if round(value) == 1 else 's'}"


def overview_charts(history: dict[str, Any]) -> list[Chart]:
    """The overview's charts of one ``GET /api/v1/history`` answer."""
    points = history["points"]
    per = "per minute" if history["step_seconds"] == 60 else f"per {history['step_seconds'] // 60} minutes"
    dated = len(points) * history["step_seconds"] > 3600  # the day view crosses midnight: say which day
    runs = [("succeeded", "succeeded", "ok"), ("failed", "failed", "bad")]
    return [
        draw(points, f"Runs ended, {per}", runs, "run", dated=dated),
        draw(points, "Queue wait, p95", [("p95", "wait_p95_seconds", "")], "", seconds=True, dated=dated),
        draw(points, "Ready tasks (most seen)", [("ready", "ready_max", "")], "task", dated=dated),
        draw(points, "Oldest ready task's age", [("age", "oldest_ready_max_seconds", "warn")], "", True, dated),
    ]
