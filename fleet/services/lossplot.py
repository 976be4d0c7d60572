"""Loss curves as an inline SVG, drawn on the server (no JavaScript, no plotting library): the
training loss and, when there is one, the held-out loss on the same axes."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import NamedTuple

WIDTH, HEIGHT, MARGIN = 480, 200, 40
TRAIN_COLOUR, HELD_OUT_COLOUR = "#417690", "#c05621"


class Curve(NamedTuple):
    name: str  # the polyline's class and its legend entry
    colour: str
    points: list[tuple[float, float]]  # (step, loss), finite losses only


def _finite(points: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    return [(float(s), float(v)) for s, v in points if v == v and abs(v) != float("inf")]


def _ticks(lo: float, hi: float) -> list[float]:
    if hi == lo:
        return [lo]
    return [lo + (hi - lo) * i / 4 for i in range(5)]


def loss_curve_svg(
    points: Sequence[Sequence[float]], title: str = "loss", held_out: Sequence[Sequence[float]] = ()
) -> str:
    """``points`` and ``held_out``: ``[[step, loss], ...]``. One polyline per curve over shared
    axes with the first and last steps and the loss range labelled, and a legend when both are
    drawn; nothing recorded draws a note instead of a curve."""
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="loss-curve" role="img" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}"><title>{escape(title)}</title>'
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white" stroke="#ccc"/>'
    )
    curves = [
        curve
        for curve in (
            Curve("loss", TRAIN_COLOUR, _finite(points)),
            Curve("held-out", HELD_OUT_COLOUR, _finite(held_out)),
        )
        if curve.points
    ]
    if not curves:
        return (
            head
            + f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no loss recorded</text></svg>'
        )
    every = [point for curve in curves for point in curve.points]
    steps, losses = [s for s, _ in every], [v for _, v in every]
    s0, s1, lo, hi = min(steps), max(steps), min(losses), max(losses)
    span_s, span_l = (s1 - s0) or 1.0, (hi - lo) or 1.0
    plot_w, plot_h = WIDTH - 2 * MARGIN, HEIGHT - 2 * MARGIN

    def x(step: float) -> float:
        return MARGIN + (step - s0) / span_s * plot_w

    def y(loss: float) -> float:
        return HEIGHT - MARGIN - (loss - lo) / span_l * plot_h

    parts = [head]
    bottom = HEIGHT - MARGIN
    parts.append(
        f'<line x1="{MARGIN}" y1="{bottom}" x2="{WIDTH - MARGIN}" y2="{bottom}" stroke="#888"/>'
        f'<line x1="{MARGIN}" y1="{MARGIN}" x2="{MARGIN}" y2="{bottom}" stroke="#888"/>'
    )
    for tick in _ticks(lo, hi):
        parts.append(
            f'<text x="{MARGIN - 4}" y="{y(tick) + 4:.1f}" font-size="10" text-anchor="end">{tick:.3g}</text>'
        )
    for step in sorted({s0, s1}):
        parts.append(
            f'<text x="{x(step):.1f}" y="{HEIGHT - MARGIN + 14}" font-size="10" '
            f'text-anchor="middle">{step:g}</text>'
        )
    for curve in curves:
        coords = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in curve.points)
        parts.append(
            f'<polyline class="{curve.name}" fill="none" stroke="{curve.colour}" stroke-width="2" '
            f'points="{coords}"/>'
        )
        for s, v in curve.points if len(curve.points) == 1 else ():
            parts.append(f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3" fill="{curve.colour}"/>')
    if len(curves) > 1:
        for row, curve in enumerate(curves):
            top = MARGIN / 2 + 12 * row
            parts.append(
                f'<text class="legend" x="{WIDTH - MARGIN}" y="{top:.1f}" font-size="10" '
                f'text-anchor="end" fill="{curve.colour}">{curve.name}</text>'
            )
    parts.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 6}" font-size="11" text-anchor="middle">step</text>')
    return "".join(parts) + "</svg>"
