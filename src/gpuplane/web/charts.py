"""Charts drawn on the server as inline SVG: no script, no third-party asset, nothing to load.

Each function returns ``Markup`` (safe to put in a template) built only from numbers and
escaped text, so a label read from the cluster can never inject markup. Colours come from
CSS classes (``series-0`` ...), so the stylesheet decides the palette.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a time chart: ``(unix seconds, value)`` points in time order."""

    name: str
    points: tuple[tuple[float, float], ...]


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def quota_bar(nominal: float, used: float, borrowed: float, lent: float, limit: float) -> Markup:
    """A horizontal bar: used within nominal, borrowed beyond it, lent out of the unused part.

    ``limit`` is the scale (nominal plus borrowing limit, or the largest value shown).
    """
    width, height = 240.0, 14.0
    scale = width / limit if limit > 0 else 0.0
    own = min(used, nominal)
    parts = [
        f'<svg class="qbar" viewBox="0 0 {_num(width)} {_num(height)}" width="{_num(width)}" '
        f'height="{_num(height)}" role="img">',
        f'<rect class="q-nominal" x="0" y="0" width="{_num(nominal * scale)}" height="{_num(height)}"/>',
        f'<rect class="q-used" x="0" y="2" width="{_num(own * scale)}" height="{_num(height - 4)}"/>',
    ]
    if borrowed > 0:
        parts.append(
            f'<rect class="q-borrowed" x="{_num(nominal * scale)}" y="2" '
            f'width="{_num(borrowed * scale)}" height="{_num(height - 4)}"/>'
        )
    if lent > 0:
        parts.append(
            f'<rect class="q-lent" x="{_num((nominal - lent) * scale)}" y="2" '
            f'width="{_num(lent * scale)}" height="{_num(height - 4)}"/>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def hbars(items: Sequence[tuple[str, float]], unit: str = "") -> Markup:
    """Labelled horizontal bars, one per item, scaled to the largest value."""
    if not items:
        return Markup('<p class="muted">nothing to show</p>')
    top = max(v for _, v in items) or 1.0
    row, label_w, bar_w = 22, 190, 300
    height = row * len(items)
    parts = [
        f'<svg class="hbars" viewBox="0 0 {label_w + bar_w + 90} {height}" '
        f'width="{label_w + bar_w + 90}" height="{height}" role="img">'
    ]
    for i, (label, value) in enumerate(items):
        y = i * row
        w = bar_w * value / top
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{escape(label)}</text>'
            f'<rect class="series-{i % 6}" x="{label_w}" y="{y + 3}" width="{_num(w)}" height="{row - 6}"/>'
            f'<text x="{label_w + _num_f(w) + 6}" y="{y + 15}">{escape(_num(value))}{escape(unit)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _num_f(value: float) -> float:
    return round(value, 1)


def time_chart(series: Sequence[Series], y_label: str) -> Markup:
    """Lines over time with a legend; the y axis starts at zero."""
    points = [p for s in series for p in s.points]
    if not points:
        return Markup('<p class="muted">no samples in this window</p>')
    width, height, left, bottom = 640.0, 220.0, 48.0, 24.0
    t0 = min(t for t, _ in points)
    t1 = max(t for t, _ in points)
    top = max(v for _, v in points) or 1.0
    span = (t1 - t0) or 1.0

    def x(t: float) -> float:
        return left + (width - left - 8) * (t - t0) / span

    def y(v: float) -> float:
        return (height - bottom) - (height - bottom - 8) * v / top

    legend = 16 * (-(-len(series) // 3)) + 6
    parts = [
        f'<svg class="tchart" viewBox="0 0 {_num(width)} {_num(height + legend)}" width="{_num(width)}" '
        f'height="{_num(height + legend)}" role="img">',
        f'<line class="axis" x1="{_num(left)}" y1="{_num(height - bottom)}" x2="{_num(width - 8)}" '
        f'y2="{_num(height - bottom)}"/>',
        f'<line class="axis" x1="{_num(left)}" y1="8" x2="{_num(left)}" y2="{_num(height - bottom)}"/>',
        f'<text x="{_num(left - 4)}" y="14" text-anchor="end">{escape(_num(top))}</text>',
        f'<text x="{_num(left - 4)}" y="{_num(height - bottom)}" text-anchor="end">0</text>',
        f'<text x="{_num(left)}" y="{_num(height - 6)}">-{escape(_duration(t1 - t0))}</text>',
        f'<text x="{_num(width - 8)}" y="{_num(height - 6)}" text-anchor="end">now</text>',
        f'<text x="{_num(left + 6)}" y="20" class="muted">{escape(y_label)}</text>',
    ]
    per_row = 3
    for i, s in enumerate(series):
        coords = " ".join(f"{_num(x(t))},{_num(y(v))}" for t, v in s.points)
        parts.append(f'<polyline class="line series-{i % 6}" points="{coords}"/>')
        lx = left + 200 * (i % per_row)
        ly = height + 6 + 16 * (i // per_row)
        parts.append(
            f'<rect class="series-{i % 6}" x="{_num(lx)}" y="{_num(ly)}" width="10" height="10"/>'
            f'<text x="{_num(lx + 14)}" y="{_num(ly + 9)}">{escape(s.name)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _duration(seconds: float) -> str:
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f}h"
    if seconds >= 120:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:.0f}s"
