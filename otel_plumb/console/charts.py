"""Small inline SVG charts (no script, no external file): conformance over time with its Wilson
band, and per-perturbation bounds."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

W, H, PAD = 560, 120, 24


def _x(i: int, n: int) -> float:
    return PAD + (W - 2 * PAD) * (i / max(1, n - 1))


def _y(v: float) -> float:
    return H - PAD - (H - 2 * PAD) * v


def conformance_chart(buckets: Sequence[Mapping[str, Any]]) -> str:
    """The rate per bucket as a line, its Wilson 95% interval as a band; empty buckets are gaps."""
    points = [(i, b) for i, b in enumerate(buckets) if b.get("n")]
    if not points:
        return ""
    n = len(buckets)
    upper = " ".join(f"{_x(i, n):.1f},{_y(b['hi']):.1f}" for i, b in points)
    lower = " ".join(f"{_x(i, n):.1f},{_y(b['lo']):.1f}" for i, b in reversed(points))
    line = " ".join(f"{_x(i, n):.1f},{_y(b['rate']):.1f}" for i, b in points)
    dots = "".join(
        f'<circle cx="{_x(i, n):.1f}" cy="{_y(b["rate"]):.1f}" r="2.5"><title>{b["successes"]}/{b["n"]} '
        f"({b['rate'] * 100:.1f}%, Wilson 95% {b['lo'] * 100:.1f}–{b['hi'] * 100:.1f}%)</title></circle>"
        for i, b in points
    )
    return (
        f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" aria-label="conformance over time">'
        f'<line x1="{PAD}" y1="{_y(1):.1f}" x2="{W - PAD}" y2="{_y(1):.1f}" class="grid"/>'
        f'<line x1="{PAD}" y1="{_y(0):.1f}" x2="{W - PAD}" y2="{_y(0):.1f}" class="grid"/>'
        f'<text x="2" y="{_y(1) + 4:.1f}">100%</text><text x="2" y="{_y(0) + 4:.1f}">0%</text>'
        f'<polygon points="{upper} {lower}" class="band"/><polyline points="{line}" class="rate"/>{dots}</svg>'
    )


def bounds_chart(perturbations: Mapping[str, Mapping[str, Any]]) -> str:
    """Critical conformance per perturbation: the rate as a bar, the Wilson interval as a whisker."""
    rows = [(name, p.get("critical_conformance") or {}) for name, p in perturbations.items()]
    if not rows:
        return ""
    height = 22 * len(rows) + 10
    width = W
    scale = width - 300
    parts = []
    for i, (name, r) in enumerate(rows):
        y = 8 + 22 * i
        rate, lo, hi = r.get("rate"), r.get("lo", 0.0), r.get("hi", 1.0)
        label = html.escape(str(name))
        shown = "n/a" if rate is None else f"{rate * 100:.0f}% [{lo * 100:.0f}, {hi * 100:.0f}]"
        parts.append(f'<text x="0" y="{y + 12}">{label}</text>')
        if rate is not None:
            parts.append(f'<rect x="140" y="{y}" width="{scale * rate:.1f}" height="14" class="bar"/>')
        parts.append(f'<line x1="{140 + scale * lo:.1f}" y1="{y + 7}" x2="{140 + scale * hi:.1f}" y2="{y + 7}" '
                     f'class="whisker"/>')  # fmt: skip
        parts.append(f'<text x="{width - 150}" y="{y + 12}">{html.escape(shown)}</text>')
    return f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="bounds">{"".join(parts)}</svg>'
