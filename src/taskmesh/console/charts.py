"""Small line charts drawn on the server as inline SVG (no script, no library: the CSP allows no inline script,
and SVG drawn from numbers alone cannot carry markup).

A chart is built from the points of ``GET /api/v1/history``: each line is one field, scaled to the
largest value of the chart; a step with no value (``None``) breaks the line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

WIDTH, HEIGHT = 600, 120
"""The charts' viewBox, in SVG units (the CSS scales it to the card)."""


@dataclass(frozen=True)
class Line:
    """One series: its label, its CSS class, its polyline segments (``"x,y x,y ..."``), its latest value in words."""

    label: str
    css: str
    segments: list[str]
    dots: list[tuple[str, str]]
    latest: str


@dataclass(frozen=True)
class Chart:
    """A chart: its title, the top of its scale in words, its lines, and the span's ends."""

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
) -> Chart:
    """A chart of ``series`` (``(label, field, css class)``) over ``points``, oldest first.

    The last point is the step still going: its value is shown in words (``latest``) and counts
    for the scale, but the lines end at the last full step (a partial step would draw a dip).

    :param unit: what a value counts (singular: "run", "task"); with ``seconds``, values are durations.
    """
    values = [p[field] for p in points for _, field, _ in series if p[field] is not None]
    top = nice_ceiling(max(values, default=0))
    full = points[:-1]
    n = max(len(full) - 1, 1)
    lines = []
    for label, field, css in series:
        segments: list[str] = []
        current: list[str] = []
        for i, p in enumerate(full):
            v = p[field]
            if v is None:
                if current:
                    segments.append(" ".join(current))
                current = []
                continue
            x = i * WIDTH / n
            y = HEIGHT - (v / top) * (HEIGHT - 4) - 2
            current.append(f"{x:.1f},{y:.1f}")
        if current:
            segments.append(" ".join(current))
        latest = points[-1][field] if points else None
        lone = [(s.split(",")[0], s.split(",")[1]) for s in segments if " " not in s]  # between gaps: a dot
        lines.append(Line(label, css, [s for s in segments if " " in s], lone, format_value(latest, unit, seconds)))
    return Chart(
        title=title,
        top=format_value(top, unit, seconds),
        lines=lines,
        first_at=str(full[0]["at"]) if full else "",
        last_at=str(full[-1]["at"]) if full else "",
        empty=not values,
    )


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
    return [
        draw(points, f"Runs ended, {per}", [("succeeded", "succeeded", "ok"), ("failed", "failed", "bad")], "run"),
        draw(points, "Queue wait, p95", [("p95", "wait_p95_seconds", "")], "", seconds=True),
        draw(points, "Ready tasks (most seen)", [("ready", "ready_max", "")], "task"),
        draw(points, "Oldest ready task's age", [("age", "oldest_ready_max_seconds", "warn")], "", seconds=True),
    ]
