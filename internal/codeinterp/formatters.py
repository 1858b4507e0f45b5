# Warren's IPython formatters for E2B's extra result formats, installed in
# every Python kernel by bridge.py (run in a namespace of its own, not the
# user's):
#
#   e2b/data   a pandas DataFrame as {column: [values...]} (JSON-safe, at
#              most MAX_ROWS rows)
#   e2b/chart  a matplotlib Figure as the chart the SDK's `charts` types
#              describe: line, scatter, bar, pie, box_and_whisker,
#              superchart (several axes) or unknown
#
# Registered by type name, so neither pandas nor matplotlib is imported
# until the user's code does. Written for Warren.
import json
import re
import sys

from IPython import get_ipython
from IPython.core.formatters import BaseFormatter
from traitlets import ObjectName, Unicode

MAX_ROWS = 10000
MAX_POINTS = 10000


class _DictFormatter(BaseFormatter):
    _return_type = (dict,)


class DataFormatter(_DictFormatter):
    format_type = Unicode("e2b/data")
    print_method = ObjectName("_repr_e2b_data_")


class ChartFormatter(_DictFormatter):
    """Not a type printer: IPython's inline backend pops every formatter's
    printer for Figure when it configures itself."""

    format_type = Unicode("e2b/chart")
    print_method = ObjectName("_repr_e2b_chart_")

    def __call__(self, obj):
        figure = sys.modules.get("matplotlib.figure")
        if figure is None or not isinstance(obj, figure.Figure):
            return None
        try:
            return figure_chart(obj)
        except Exception:  # a chart we cannot read is only a PNG
            return None


def dataframe_data(df):
    split = json.loads(df.head(MAX_ROWS).to_json(orient="split", date_format="iso", default_handler=str))
    return {str(c): [row[i] for row in split["data"]] for i, c in enumerate(split["columns"])}


def _unit(label):
    m = re.search(r"[\(\[]([^\(\)\[\]]+)[\)\]]\s*$", label or "")
    return m.group(1) if m else None


def _scale(ax, axis):
    import matplotlib.category
    import matplotlib.dates

    a = ax.xaxis if axis == "x" else ax.yaxis
    conv = a.get_converter() if hasattr(a, "get_converter") else a.converter
    if isinstance(conv, matplotlib.category.StrCategoryConverter):
        return "categorical"
    if isinstance(conv, (matplotlib.dates.DateConverter, matplotlib.dates._SwitchableDateConverter)) or \
            type(conv).__name__.endswith("DateConverter"):
        return "datetime"
    return ax.get_xscale() if axis == "x" else ax.get_yscale()


def _value(v, scale, ax, axis):
    import matplotlib.dates

    if scale == "datetime":
        return matplotlib.dates.num2date(v).isoformat()
    if scale == "categorical":
        a = ax.xaxis if axis == "x" else ax.yaxis
        mapping = {i: k for k, i in a.units._mapping.items()} if a.units is not None else {}
        return mapping.get(int(round(v)), v) if float(v).is_integer() else v
    return float(v)


def _axis_info(ax, axis):
    ticks = ax.get_xticks() if axis == "x" else ax.get_yticks()
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    scale = _scale(ax, axis)
    label = ax.get_xlabel() if axis == "x" else ax.get_ylabel()
    return {
        axis + "_label": label or None,
        axis + "_unit": _unit(label),
        axis + "_ticks": [_value(t, scale, ax, axis) for t in ticks],
        axis + "_tick_labels": [t.get_text() for t in labels],
        axis + "_scale": scale,
    }


def _tick_label_at(ax, x):
    for tick, text in zip(ax.get_xticks(), ax.get_xticklabels()):
        if abs(tick - x) < 1e-9:
            return text.get_text()
    return str(x)


def _pie(ax):
    from matplotlib.patches import Wedge

    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if not wedges or len(wedges) != len(ax.patches):
        return None
    return {"type": "pie", "title": ax.get_title(), "elements": [
        {"label": w.get_label(), "angle": abs(w.theta2 - w.theta1), "radius": w.r} for w in wedges]}


def _bar(ax):
    from matplotlib.container import BarContainer

    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if not bars:
        return None
    chart = {"type": "bar", "title": ax.get_title(), "elements": []}
    for name in ("x_label", "y_label"):
        label = ax.get_xlabel() if name == "x_label" else ax.get_ylabel()
        chart[name] = label or None
        chart[name[0] + "_unit"] = _unit(label)
    for c in bars:
        group = c.get_label()
        if group is None or group.startswith("_"):
            group = ""
        for rect in c:
            x = rect.get_x() + rect.get_width() / 2
            chart["elements"].append({"label": _tick_label_at(ax, x), "value": str(rect.get_height()), "group": group})
    return chart


def _box(ax):
    # A boxplot draws each box as a closed 5-point line (q1 → q3), its
    # median as a 2-point line across it, whiskers and caps as 2-point
    # lines, and outliers as a marker-only line, all unlabelled.
    boxes = []
    for line in ax.get_lines():
        x, y = line.get_xdata(), line.get_ydata()
        if len(x) == 5 and x[0] == x[3] == x[4] and x[1] == x[2] and y[0] == y[1] == y[4] and y[2] == y[3]:
            boxes.append(line)
    if not boxes:
        return None
    chart = {"type": "box_and_whisker", "title": ax.get_title(), "elements": []}
    for name in ("x_label", "y_label"):
        label = ax.get_xlabel() if name == "x_label" else ax.get_ylabel()
        chart[name] = label or None
        chart[name[0] + "_unit"] = _unit(label)
    others = [l for l in ax.get_lines() if l not in boxes]
    for box in boxes:
        x, y = box.get_xdata(), box.get_ydata()
        lo, hi = min(x[0], x[1]), max(x[0], x[1])
        center = (lo + hi) / 2
        q1, q3 = min(y[0], y[2]), max(y[0], y[2])
        median, ys, outliers = None, [q1, q3], []
        for l in others:
            lx, ly = list(l.get_xdata()), list(l.get_ydata())
            if not lx or not all(lo - 1e-9 <= v <= hi + 1e-9 for v in lx):
                continue
            if l.get_linestyle() in ("None", "none", "", " "):
                outliers.extend(float(v) for v in ly)
            elif len(ly) == 2 and ly[0] == ly[1] and min(lx) == lo and max(lx) == hi and q1 <= ly[0] <= q3:
                median = float(ly[0])
            else:  # whiskers and caps
                ys.extend(float(v) for v in ly)
        chart["elements"].append({
            "label": _tick_label_at(ax, center), "min": float(min(ys)), "first_quartile": float(q1),
            "median": float(median if median is not None else (q1 + q3) / 2), "third_quartile": float(q3),
            "max": float(max(ys)), "outliers": outliers,
        })
    return chart


def _points(ax):
    from matplotlib.collections import PathCollection

    lines = [l for l in ax.get_lines() if l.get_linestyle() not in ("None", "none", "", " ")]
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    if not lines and not scatters:
        return None
    kind = "line" if lines else "scatter"
    chart = {"type": kind, "title": ax.get_title(), "elements": []}
    chart.update(_axis_info(ax, "x"))
    chart.update(_axis_info(ax, "y"))
    xs, ys = chart["x_scale"], chart["y_scale"]
    if kind == "line":
        series = [(l.get_label(), zip(l.get_xdata(orig=False), l.get_ydata(orig=False))) for l in lines]
    else:
        series = [(c.get_label(), c.get_offsets()) for c in scatters]
    for label, pts in series:
        if label is None or label.startswith("_"):  # matplotlib's own (_child0…)
            label = ""
        points = []
        for i, (x, y) in enumerate(pts):
            if i >= MAX_POINTS:
                break
            points.append([_value(x, xs, ax, "x"), _value(y, ys, ax, "y")])
        chart["elements"].append({"label": label, "points": points})
    return chart


def axes_chart(ax):
    for kind in (_pie, _bar, _box, _points):
        chart = kind(ax)
        if chart is not None:
            return chart
    return {"type": "unknown", "title": ax.get_title(), "elements": []}


def figure_chart(fig):
    axes = [ax for ax in fig.get_axes() if ax.get_visible() and not hasattr(ax, "_colorbar")]
    if not axes:
        return None
    if len(axes) == 1:
        return axes_chart(axes[0])
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    return {"type": "superchart", "title": title, "elements": [axes_chart(ax) for ax in axes]}


def _safe(f):
    def wrapped(obj):
        try:
            return f(obj)
        except Exception:  # a chart we cannot read is only a PNG
            return None
    return wrapped


def install():
    ip = get_ipython()
    if ip is None:
        return
    df = ip.display_formatter
    data = DataFormatter(parent=df)
    data.for_type_by_name("pandas.core.frame", "DataFrame", _safe(dataframe_data))
    for name, f in (("e2b/data", data), ("e2b/chart", ChartFormatter(parent=df))):
        df.formatters[name] = f
        if df.active_types and name not in df.active_types:
            df.active_types.append(name)


install()
