"""A thin builder of plotly figure dicts: a 1-D grid of subplots, traces, reference lines.

Why not `plotly.graph_objects`: its property validation made figure construction ~0.5 s per subplot
figure (most of a report's build time); plain dicts are the same JSON for plotly.js at a tiny fraction
of the cost. The tests pass every figure through `go.Figure(...)` once, so a misspelt property still fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

GRID = "#e6e6e6"


def _axis(kind: str, k: int) -> str:
    return f"{kind}axis{k if k > 1 else ''}"


def _ref(kind: str, k: int) -> str:
    return f"{kind}{k if k > 1 else ''}"


class Fig:
    """`rows` x `cols` subplots (numbered row-major from 1). `shared_x` links the x axes of a column."""

    def __init__(
        self,
        rows: int = 1,
        cols: int = 1,
        *,
        titles: Sequence[str] = (),
        row_heights: Sequence[float] | None = None,
        shared_x: bool = False,
        vspace: float = 0.07,
        hspace: float = 0.08,
    ) -> None:
        self.rows, self.cols = rows, cols
        self.data: list[dict[str, Any]] = []
        self.layout: dict[str, Any] = {"shapes": [], "annotations": []}
        heights = np.asarray(row_heights if row_heights is not None else [1.0] * rows, float)
        heights = heights / heights.sum() * (1 - vspace * (rows - 1))
        width = (1 - hspace * (cols - 1)) / cols
        for r in range(rows):
            top = 1 - heights[:r].sum() - vspace * r
            for c in range(cols):
                k = r * cols + c + 1
                x0 = c * (width + hspace)
                bottom_k = (rows - 1) * cols + c + 1
                xa: dict[str, Any] = {"domain": [x0, x0 + width], "anchor": _ref("y", k), **_axis_style()}
                if shared_x and rows > 1 and k != bottom_k:
                    xa.update(matches=_ref("x", bottom_k), showticklabels=False)
                self.layout[_axis("x", k)] = xa
                self.layout[_axis("y", k)] = {"domain": [top - heights[r], top], "anchor": _ref("x", k), **_axis_style()}
                if k - 1 < len(titles):
                    self.layout["annotations"].append({
                        "text": titles[k - 1], "x": x0 + width / 2, "y": top, "xref": "paper", "yref": "paper",
                        "xanchor": "center", "yanchor": "bottom", "showarrow": False, "font": {"size": 13},
                    })

    def add(self, trace: dict[str, Any], k: int = 1) -> None:
        self.data.append({"type": "scatter", **trace, "xaxis": _ref("x", k), "yaxis": _ref("y", k)})

    def x_axis(self, k: int = 1, **props: Any) -> None:
        self.layout[_axis("x", k)].update(props)

    def y_axis(self, k: int = 1, **props: Any) -> None:
        self.layout[_axis("y", k)].update(props)

    def hline(self, y: float, k: int = 1, *, color: str, dash: str = "dash", width: float = 1.5,
              label: str | None = None) -> None:
        """A horizontal line across subplot k; `label` must be escaped already."""
        self.layout["shapes"].append({
            "type": "line", "xref": f"{_ref('x', k)} domain", "x0": 0, "x1": 1, "yref": _ref("y", k), "y0": y, "y1": y,
            "line": {"color": color, "dash": dash, "width": width},
        })
        if label:
            self.layout["annotations"].append({
                "text": label, "xref": f"{_ref('x', k)} domain", "x": 0.01, "yref": _ref("y", k), "y": y,
                "xanchor": "left", "yanchor": "bottom", "showarrow": False, "font": {"color": color, "size": 11},
            })

    def vline(self, x: float, k: int | None = None, *, color: str, dash: str = "dash", width: float = 1.5,
              label: str | None = None, label_y: float = 1.0) -> None:
        """A vertical line in subplot k, or through the whole figure height when k is None."""
        xref = _ref("x", k or 1)  # with shared x, every subplot's axis matches the first's range
        yref, y0, y1 = ("paper", 0, 1) if k is None else (f"{_ref('y', k)} domain", 0, 1)
        self.layout["shapes"].append({"type": "line", "xref": xref, "x0": x, "x1": x, "yref": yref, "y0": y0, "y1": y1,
                                      "line": {"color": color, "dash": dash, "width": width}})
        if label:
            self.layout["annotations"].append({
                "text": label, "xref": xref, "x": x, "yref": yref, "y": label_y, "xanchor": "left", "yanchor": "bottom",
                "showarrow": False, "font": {"color": color, "size": 11},
            })

    def to_dict(self) -> dict[str, Any]:
        from _plotly_utils.utils import convert_to_base64  # plotly's: imported when a report is drawn

        d = {"data": self.data, "layout": {**self.layout, "annotations": self._log_annotations()}}
        convert_to_base64(d)  # numpy columns -> plotly.js typed arrays (base64): compact, and exact
        return d


    def _log_annotations(self) -> list[dict[str, Any]]:
        """plotly.js places an annotation on a log axis at 10**value (unlike shapes and traces), so a label
        at y=50 on a log axis would sit at 1e50 and stretch the axis to it: convert here."""
        out = []
        for ann in self.layout["annotations"]:
            ann = dict(ann)
            for xy in ("x", "y"):
                ref = str(ann.get(f"{xy}ref", ""))
                is_axis = ref[:1] == xy and " " not in ref
                axis = self.layout.get(_axis(xy, int(ref[1:] or 1))) if is_axis else None
                if axis is not None and axis.get("type") == "log":
                    v = float(ann[xy])
                    ann[xy] = float(np.log10(v)) if v > 0 else None
            out.append(ann)
        return out


def _axis_style() -> dict[str, Any]:
    return {"gridcolor": GRID, "zerolinecolor": GRID, "linecolor": "#999", "showline": True, "automargin": True}


MANTISSAS = (tuple(range(1, 10)), (1, 2, 5), (1, 3), (1,))  # finest first
MAX_TICKS = 10


def log_ticks(values: Any) -> dict[str, Any]:
    """A log axis whose tick labels are the full numbers (1, 2, 5, 10, 20, 50, 100, 200, ...): the finest
    1-2-5 family that puts at most MAX_TICKS ticks over the values' span. plotly's own labels a log axis's
    minor ticks in short (a "2" after "10" for 20), which reads as a smaller number than the one before."""
    v = np.asarray(values, float).ravel()
    v = v[np.isfinite(v) & (v > 0)]
    if not len(v):
        return {"type": "log"}
    lo, hi = float(v.min()), float(v.max())
    decades = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    for mantissas in MANTISSAS:
        ticks = [m * 10.0**e for e in decades for m in mantissas]
        if sum(lo <= t <= hi for t in ticks) <= MAX_TICKS:
            break
    return {"type": "log", "tickvals": ticks, "ticktext": [_tick_text(t) for t in ticks]}


def _tick_text(t: float) -> str:
    return f"{t:,.0f}" if t >= 1 else f"{t:.10f}".rstrip("0")
