"""A loss curve as an inline SVG, drawn on the server (no JavaScript, no plotting library)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT, MARGIN = 480, 200, 40


def _ticks(lo: float, hi: float) -> list[float]:
    if hi == lo:
        return [lo]
    return [lo + (hi - lo) * i / 4 for i in range(5)]


def loss_curve_svg(points: Sequence[Sequence[float]], title: str = "loss") -> str:
    """``points``: ``[[step, loss], ...]``. A polyline over axes with the first and last steps and
    the loss range labelled; an empty history draws a note instead of a curve."""
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="loss-curve" role="img" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}"><title>{escape(title)}</title>'
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white" stroke="#ccc"/>'
    )
    finite = [(float(s), float(v)) for s, v in points if v == v and abs(v) != float("inf")]
    if not finite:
        return (
            head
            + f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no loss recorded</text></svg>'
        )
    steps, losses = [s for s, _ in finite], [v for _, v in finite]
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
    coords = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in finite)
    parts.append(f'<polyline class="loss" fill="none" stroke="#417690" stroke-width="2" points="{coords}"/>')
    for s, v in finite if len(finite) == 1 else ():
        parts.append(f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3" fill="#417690"/>')
    parts.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 6}" font-size="11" text-anchor="middle">step</text>')
    return "".join(parts) + "</svg>"
