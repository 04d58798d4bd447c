"""Shared look of the report's figures, and the one escaping rule for text plotly draws.

plotly.js reads trace names, titles, annotations and hover text as a small HTML-like markup (<b>, <br>,
<a href>) and decodes a few entities (&amp; &lt; &gt; and numeric ones, not &quot;), so any string a user
or a server controls goes through `esc` first: with `&`, `<` and `>` escaped no tag can form, and the
text shows literally. The HTML page itself escapes quotes too (`html.escape`).
"""

from __future__ import annotations

import html
from typing import Any

from slobench.printable import printable

OK = "#4c78a8"
MISS = "#d62728"
FAIL = "#111111"
TARGET = "#2ca02c"
SERIES_COLORS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")

# No logo link, no cloud buttons: the file must work, and stay quiet, offline.
PLOTLY_CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["sendDataToCloud"]}


def esc(text: object) -> str:
    """For text plotly draws; control characters shown as escapes."""
    return html.escape(printable(text), quote=False)


def series_color(i: int) -> str:
    return SERIES_COLORS[i % len(SERIES_COLORS)]


def rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def base_layout(title: str, *, height: int = 480) -> dict[str, Any]:
    """`title` must already be escaped (it usually holds a run or sweep name)."""
    return {
        "title": {"text": title, "x": 0.01, "font": {"size": 15}},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "colorway": list(SERIES_COLORS),
        "height": height,
        "margin": {"l": 70, "r": 30, "t": 70, "b": 120},
        # under the plot in pixels from the bottom edge, so it never meets the x-axis title
        "legend": {"orientation": "h", "yref": "container", "yanchor": "bottom", "y": 0.01, "x": 0},
        "hovermode": "closest",
        "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12},
    }
