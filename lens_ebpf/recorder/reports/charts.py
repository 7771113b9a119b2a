"""The report's charts as inline SVG: drawn here, so the HTML needs no script, font or image
from anywhere (it opens offline, prints, and goes by mail)."""

from __future__ import annotations

from html import escape

BLUE, GREEN, GREY, RED = "#3b6fd8", "#2e9d5b", "#c9ced6", "#d0473c"
FONT = "font-family='Helvetica, Arial, sans-serif'"
CHAR_W = 6.5  # px: the widest a character of the 11 px font runs, digits and letters


def _num(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def daily_bars(
    dates: list[str],
    series: list[tuple[str, str, list[float | None]]],
    width: int = 720,
    height: int = 260,
) -> str:
    """Grouped bars per day, 0 to 100 percent: series are (name, colour, values); a value
    that is unknown draws no bar and says so."""
    left, right, top, bottom = 44, 12, 28, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' role='img' {FONT} font-size='11'>"
    ]
    for pct in (0, 25, 50, 75, 100):
        y = top + plot_h * (1 - pct / 100)
        out.append(
            f"<line x1='{left}' y1='{y:.1f}' x2='{width - right}' y2='{y:.1f}' "
            f"stroke='{GREY}' stroke-width='0.6'/>"
            f"<text x='{left - 6}' y='{y + 4:.1f}' "
            f"text-anchor='end'>{pct}%</text>"
        )
    n = max(len(dates), 1)
    slot = plot_w / n
    bar = slot * 0.8 / max(len(series), 1)
    for i, day in enumerate(dates):
        x0 = left + slot * i + slot * 0.1
        for j, (name, colour, values) in enumerate(series):
            v = values[i]
            x = x0 + bar * j
            if v is None:
                out.append(
                    f"<text x='{x + bar / 2:.1f}' y='{top + plot_h - 4:.1f}' "
                    "text-anchor='middle' font-size='9'>n/a</text>"
                )
                continue
            h = plot_h * min(max(v, 0.0), 100.0) / 100
            out.append(
                f"<rect x='{x:.1f}' y='{top + plot_h - h:.1f}' width='{bar:.1f}' "
                f"height='{h:.1f}' fill='{colour}'><title>{escape(name)} {escape(day)}: "
                f"{_num(v)}%</title></rect>"
                f"<text x='{x + bar / 2:.1f}' y='{top + plot_h - h - 3:.1f}' "
                f"text-anchor='middle' font-size='9'>{_num(v)}</text>"
            )
        out.append(
            f"<text x='{left + slot * (i + 0.5):.1f}' y='{height - bottom + 16}' "
            f"text-anchor='middle'>{escape(day[5:])}</text>"
        )
    x = left
    for name, colour, _ in series:
        out.append(
            f"<rect x='{x}' y='8' width='12' height='12' fill='{colour}'/>"
            f"<text x='{x + 16}' y='18'>{escape(name)}</text>"
        )
        x += 24 + 7 * len(name)
    out.append("</svg>")
    return "".join(out)


def hour_bars(rows: list[tuple[str, float, float | None]], width: int = 720) -> str:
    """Horizontal bars: per name, GPU-hours allocated (grey) with those used over it
    (green); used unknown draws the allocated bar alone."""
    label_w, right, row_h = 200, 90, 22
    height = 12 + row_h * max(len(rows), 1)
    most = max((a for _, a, _ in rows), default=0.0) or 1.0
    plot_w = width - label_w - right
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' role='img' {FONT} font-size='11'>"
    ]
    for i, (name, alloc, used) in enumerate(rows):
        y = 6 + row_h * i
        w = plot_w * alloc / most
        short = name if len(name) <= 32 else name[:31] + "\u2026"
        out.append(
            f"<text x='{label_w - 6}' y='{y + 14}' text-anchor='end'>"
            f"{escape(short)}</text>"
            f"<rect x='{label_w}' y='{y + 2}' width='{w:.1f}' height='{row_h - 6}' "
            f"fill='{GREY}'/>"
        )
        if used is not None:
            out.append(
                f"<rect x='{label_w}' y='{y + 2}' width='{plot_w * used / most:.1f}' "
                f"height='{row_h - 6}' fill='{GREEN}'/>"
            )
        note = f"{_num(alloc)} h" + ("" if used is None else f" / {_num(used)} used")
        if label_w + w + 4 + CHAR_W * len(note) <= width:  # after the bar
            out.append(f"<text x='{label_w + w + 4:.1f}' y='{y + 14}'>{escape(note)}</text>")
        else:  # the longest bars: inside their end, where it is not cut by the edge
            out.append(
                f"<text x='{label_w + w - 4:.1f}' y='{y + 14}' text-anchor='end'>"
                f"{escape(note)}</text>"
            )
    out.append("</svg>")
    return "".join(out)
