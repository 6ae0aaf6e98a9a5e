"""E2B's chart extraction, run inside a sandbox: what a matplotlib figure shows, as data (``Result.chart``).

This file's source is part of the code interpreter's in-sandbox driver (``cells.py`` appends it), so it
imports nothing at module level beyond the standard library and looks matplotlib up in ``sys.modules``: a
figure exists only once the program imported it. Types follow the SDK's ``e2b_code_interpreter.charts``:
line, scatter, bar, pie, box and whisker, a superchart of several axes, or unknown; 2D charts carry their
labels, the unit in a label's last parentheses ("Time (s)": "s"), ticks, tick labels and scales.
"""

import datetime as _dt
import re as _re
import sys as _chart_sys
from typing import Any

_UNIT = _re.compile(r"\(([^()]+)\)\s*$")


def _mpl(name: str) -> Any:
    return _chart_sys.modules.get(name)


def _text(value: str) -> str | None:
    return value or None


def _number(value: Any) -> float:
    return float(value)


def _scale(axis: Any, scale: str) -> str:
    category = _mpl("matplotlib.category")
    dates = _mpl("matplotlib.dates")
    units = axis.get_units()
    if category is not None and isinstance(units, category.UnitData):
        return "categorical"
    converter = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
    if dates is not None and converter is not None and "date" in type(converter).__name__.lower():
        return "datetime"
    return scale


def _categories(axis: Any) -> dict[float, str]:
    """A categorical axis's positions and the categories drawn there."""
    mapping = getattr(axis.get_units(), "_mapping", None) or {}
    return {float(position): str(name) for name, position in mapping.items()}


def _value(value: Any, kind: str, categories: dict[float, str] | None = None) -> Any:
    if kind == "datetime":
        dates = _mpl("matplotlib.dates")
        if isinstance(value, _dt.datetime | _dt.date):
            return value.isoformat()
        return dates.num2date(float(value)).replace(tzinfo=None).isoformat()
    if kind == "categorical":
        if isinstance(value, str):
            return value
        return (categories or {}).get(float(value), str(value))
    return _number(value)


def _ticks(axis: Any, kind: str) -> tuple[list[Any], list[str]]:
    ticks = [_value(t, kind) if kind == "datetime" else _number(t) for t in axis.get_ticklocs()]
    return ticks, [label.get_text() for label in axis.get_ticklabels()]


def _axes2d(ax: Any) -> dict[str, Any]:
    x_label, y_label = ax.get_xlabel(), ax.get_ylabel()
    x_unit, y_unit = _UNIT.search(x_label), _UNIT.search(y_label)
    return {
        "title": _text(ax.get_title()),
        "x_label": _text(x_label),
        "y_label": _text(y_label),
        "x_unit": x_unit.group(1) if x_unit else None,
        "y_unit": y_unit.group(1) if y_unit else None,
    }


def _point_chart(ax: Any, kind: str, series: list[tuple[str | None, list[tuple[Any, Any]]]]) -> dict[str, Any]:
    x_scale, y_scale = _scale(ax.xaxis, ax.get_xscale()), _scale(ax.yaxis, ax.get_yscale())
    x_ticks, x_tick_labels = _ticks(ax.xaxis, x_scale)
    y_ticks, y_tick_labels = _ticks(ax.yaxis, y_scale)
    x_names, y_names = _categories(ax.xaxis), _categories(ax.yaxis)
    elements = [
        {"label": label, "points": [[_value(x, x_scale, x_names), _value(y, y_scale, y_names)] for x, y in points]}
        for label, points in series
    ]
    return {
        "type": kind,
        **_axes2d(ax),
        "x_scale": x_scale,
        "y_scale": y_scale,
        "x_ticks": x_ticks,
        "x_tick_labels": x_tick_labels,
        "y_ticks": y_ticks,
        "y_tick_labels": y_tick_labels,
        "elements": elements,
    }


def _label(artist: Any) -> str | None:
    label = artist.get_label()
    return None if not label or label.startswith("_") else str(label)


def _axis_chart(ax: Any) -> dict[str, Any]:
    patches = _mpl("matplotlib.patches")
    collections = _mpl("matplotlib.collections")
    container = _mpl("matplotlib.container")
    boxes = getattr(ax, "_sandboxd_boxes", None)
    if boxes:
        elements = [
            {
                "label": label,
                "min": _number(s["whislo"]),
                "first_quartile": _number(s["q1"]),
                "median": _number(s["med"]),
                "third_quartile": _number(s["q3"]),
                "max": _number(s["whishi"]),
                "outliers": [_number(v) for v in s["fliers"]],
            }
            for label, s in boxes
        ]
        return {"type": "box_and_whisker", **_axes2d(ax), "elements": elements}
    wedges = [p for p in ax.patches if patches is not None and isinstance(p, patches.Wedge)]
    if wedges:
        # degrees as the data gave them (90% of a pie is 324, not 323.99999999999994)
        elements = [
            {"label": w.get_label(), "angle": round(abs(w.theta2 - w.theta1), 9), "radius": w.r} for w in wedges
        ]
        return {"type": "pie", "title": _text(ax.get_title()), "elements": elements}
    bars = [c for c in ax.containers if container is not None and isinstance(c, container.BarContainer)]
    if bars:
        ticks = dict(zip(ax.get_xticks(), [t.get_text() for t in ax.get_xticklabels()], strict=False))
        elements = []
        for group in bars:
            for rect in group.patches:
                x = rect.get_x() + rect.get_width() / 2
                label = next((text for tick, text in ticks.items() if abs(tick - x) < 1e-9), str(x))
                elements.append({"label": label, "group": group.get_label(), "value": _number(rect.get_height())})
        return {"type": "bar", **_axes2d(ax), "elements": elements}
    lines = [line for line in ax.get_lines() if len(line.get_xdata(orig=False))]
    if lines:
        series = [
            (_label(line), list(zip(line.get_xdata(orig=False), line.get_ydata(orig=False), strict=False)))
            for line in lines
        ]
        return _point_chart(ax, "line", series)
    scatters = [c for c in ax.collections if collections is not None and isinstance(c, collections.PathCollection)]
    if scatters:
        series = [(_label(c), [tuple(p) for p in c.get_offsets()]) for c in scatters]
        return _point_chart(ax, "scatter", series)
    return {"type": "unknown", "title": _text(ax.get_title()), "elements": []}


def chart_of(figure: Any) -> dict[str, Any] | None:
    """The chart a drawn figure shows (call it after ``savefig``: tick labels exist once it was drawn)."""
    axes = [ax for ax in figure.get_axes() if ax.get_visible() and ax.get_label() != "<colorbar>"]
    if not axes:
        return None
    suptitle = figure._suptitle.get_text() if getattr(figure, "_suptitle", None) is not None else ""
    if len(axes) > 1:
        return {"type": "superchart", "title": _text(suptitle), "elements": [_axis_chart(ax) for ax in axes]}
    chart = _axis_chart(axes[0])
    if not chart.get("title") and suptitle:
        chart["title"] = suptitle
    return chart


def record_boxplots(module: Any) -> None:
    """``Axes.boxplot`` keeps the statistics it drew on its axes, for ``chart_of`` (its artists lose them)."""
    axes = module.Axes
    if getattr(axes, "_sandboxd_boxplot", False):
        return
    boxplot = axes.boxplot

    def recording(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        drawn = boxplot(self, x, *args, **kwargs)
        cbook = _mpl("matplotlib.cbook")
        labels = kwargs.get("tick_labels", kwargs.get("labels"))
        try:
            stats = cbook.boxplot_stats(x, whis=kwargs.get("whis", 1.5), labels=list(labels) if labels else None)
            self._sandboxd_boxes = [(s.get("label", str(i + 1)), s) for i, s in enumerate(stats)]
        except Exception:  # a chart is extra: the program's plot stands whatever this finds
            pass
        return drawn

    axes.boxplot = recording
    axes._sandboxd_boxplot = True
