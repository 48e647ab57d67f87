"""Server-side SVG charts: one pure function from numbers to markup (no JavaScript, no build).

Every text that reaches the markup goes through ``html.escape``; colours come from a fixed
palette, never from the caller's data, so the result is safe to embed as is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea")
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 48, 12, 24, 22


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]  # (x, y); x in the chart's x range


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is >= value (1 for nothing)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10 * power  # pragma: no cover - the loop always returns


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def svg_chart(
    series: Sequence[Series],
    *,
    x_min: float,
    x_max: float,
    title: str,
    x_labels: Sequence[tuple[float, str]] = (),
    bars: bool = False,
    width: int = 560,
    height: int = 170,
    element_id: str | None = None,
) -> str:
    """A chart of ``series`` over [x_min, x_max] on a y axis from 0 to a round maximum.

    ``bars`` draws each point as a bar of width (x_max - x_min) / points (per-minute counts);
    otherwise points are joined by a line (sampled gauges) and a lone point is a dot. Points
    outside the x range are dropped. With no point at all the chart says so instead of
    drawing an empty frame."""
    plot_w = width - PAD_LEFT - PAD_RIGHT
    plot_h = height - PAD_TOP - PAD_BOTTOM
    span = (x_max - x_min) or 1.0
    kept = [
        [(x, max(0.0, y)) for x, y in s.points if x_min <= x <= x_max and math.isfinite(y)]
        for s in series
    ]
    top = nice_ceiling(max((y for pts in kept for _, y in pts), default=0.0))

    def sx(x: float) -> float:
        return PAD_LEFT + (x - x_min) / span * plot_w

    def sy(y: float) -> float:
        return PAD_TOP + plot_h - y / top * plot_h

    ident = f' id="{escape(element_id)}"' if element_id else ""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart"{ident} width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{PAD_LEFT}" y="15" font-size="12" font-weight="bold" '
        f'fill="#111827">{escape(title)}</text>',
    ]
    for frac in (0.0, 0.5, 1.0):  # gridlines with their values
        y = sy(top * frac)
        out.append(
            f'<line x1="{PAD_LEFT}" y1="{y:.1f}" x2="{width - PAD_RIGHT}" y2="{y:.1f}" '
            f'stroke="#e5e7eb"/>'
        )
        out.append(
            f'<text x="{PAD_LEFT - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end" '
            f'fill="#6b7280">{escape(_fmt(top * frac))}</text>'
        )
    for x, label in x_labels:
        if x_min <= x <= x_max:
            out.append(
                f'<text x="{sx(x):.1f}" y="{height - 6}" font-size="10" text-anchor="middle" '
                f'fill="#6b7280">{escape(label)}</text>'
            )
    if not any(kept):
        out.append(
            f'<text x="{PAD_LEFT + plot_w / 2:.1f}" y="{PAD_TOP + plot_h / 2:.1f}" '
            f'font-size="12" text-anchor="middle" fill="#9ca3af">no data yet</text>'
        )
    for i, pts in enumerate(kept):
        color = PALETTE[i % len(PALETTE)]
        if bars and pts:
            bar_w = max(1.0, plot_w / max(1, len(series[i].points)) - 1)
            for x, y in pts:
                h = plot_h - (sy(y) - PAD_TOP)
                if h > 0:
                    out.append(
                        f'<rect x="{sx(x) - bar_w:.1f}" y="{sy(y):.1f}" width="{bar_w:.1f}" '
                        f'height="{h:.1f}" fill="{color}"/>'
                    )
        elif len(pts) == 1:
            x, y = pts[0]
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>')
        elif pts:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
    for i, s in enumerate(series):  # legend, right-aligned on the title line
        x = width - PAD_RIGHT - 110 * (len(series) - i)
        out.append(
            f'<rect x="{x}" y="6" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{x + 14}" y="15" font-size="11" fill="#374151">{escape(s.label)}</text>'
        )
    out.append("</svg>")
    return "".join(out)
