#!/usr/bin/env python3
"""Grouped bar chart as a standalone SVG, no dependencies (the benchmark scripts' plots).

usage: scripts/svgbars.py --title TITLE --ylabel LABEL [--log] OUT.svg < TABLE.tsv

TABLE.tsv: a header line `group<TAB>series1<TAB>series2...`, then one line per group with
one number per series (empty or `-` for no bar). Each group gets one bar per series, in a
fixed colour per series; the value is printed above each bar.
"""
import argparse
import math
import sys
from xml.sax.saxutils import escape

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]


def fmt(v):
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--title", required=True)
    ap.add_argument("--ylabel", required=True)
    ap.add_argument("--log", action="store_true", help="logarithmic y axis")
    ap.add_argument("out")
    a = ap.parse_args()
    lines = [l.rstrip("\n").split("\t") for l in sys.stdin if l.strip()]
    if len(lines) < 2:
        sys.exit("svgbars: need a header and at least one row")
    series = lines[0][1:]
    groups = []
    for row in lines[1:]:
        vals = []
        for c in row[1:] + [""] * (len(series) - len(row) + 1):
            try:
                vals.append(float(c))
            except ValueError:
                vals.append(None)
        groups.append((row[0], vals[: len(series)]))
    present = [v for _, vs in groups for v in vs if v is not None and v > 0]
    vmax = max(present) if present else 1.0
    vmin = min(present) if present else 1.0

    bw = 18  # bar width
    gap = 24  # between groups
    left, right, top, bottom = 70, 20, 50, 90
    gw = bw * len(series) + gap
    width = max(left + right + gw * len(groups), 420)
    height = 360
    ph = height - top - bottom

    if a.log:
        lo = 10 ** math.floor(math.log10(vmin))
        hi = 10 ** math.ceil(math.log10(vmax))
        if hi <= lo:
            hi = lo * 10

        def y(v):
            return top + ph * (1 - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)))
        ticks = []
        t = lo
        while t <= hi * 1.0001:
            ticks.append(t)
            t *= 10
    else:
        step = 10 ** math.floor(math.log10(vmax)) if vmax > 0 else 1
        for m in (1, 2, 5, 10):
            if vmax / (step * m) <= 6:
                step *= m
                break
        hi = step * math.ceil(vmax / step)
        lo = 0.0

        def y(v):
            return top + ph * (1 - v / hi)
        ticks = [i * step for i in range(int(round(hi / step)) + 1)]

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(a.title)}</text>',
           f'<text x="14" y="{top + ph / 2}" text-anchor="middle" transform="rotate(-90 14 {top + ph / 2})">'
           f'{escape(a.ylabel)}</text>']
    for t in ticks:
        ty = y(t)
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 4}" y="{ty + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    for gi, (name, vals) in enumerate(groups):
        gx = left + gap / 2 + gi * gw
        for si, v in enumerate(vals):
            if v is None or v <= 0:
                continue
            x = gx + si * bw
            ty = y(max(v, lo if a.log else 0))
            base = y(lo) if a.log else y(0)
            out.append(f'<rect x="{x:.1f}" y="{ty:.1f}" width="{bw - 2}" height="{max(base - ty, 0.5):.1f}" '
                       f'fill="{COLOURS[si % len(COLOURS)]}"><title>{escape(series[si])}: {fmt(v)}</title></rect>')
            out.append(f'<text x="{x + bw / 2 - 1:.1f}" y="{ty - 3:.1f}" text-anchor="middle" font-size="8">'
                       f'{fmt(v)}</text>')
        cx = gx + bw * len(series) / 2
        out.append(f'<text x="{cx:.1f}" y="{top + ph + 14}" text-anchor="end" '
                   f'transform="rotate(-30 {cx:.1f} {top + ph + 14})">{escape(name)}</text>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="black"/>')
    lx = left
    ly = height - 14
    for si, s in enumerate(series):
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{COLOURS[si % len(COLOURS)]}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly}">{escape(s)}</text>')
        lx += 24 + 7 * len(s)
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
