"""The shipped Grafana dashboard drawn from a real Prometheus (docs/metrics.md, "Dashboard"):
every panel at its place on Grafana's 24-column grid, its queries run over a time range through
Prometheus's API with the dashboard's variables set, stat panels as their last value, time
series as lines named by their legend format. Grafana itself cannot be built here (its frontend
is not in its Go module), so this is matplotlib (the bench extra) drawing the same queries: the
data and the layout are the dashboard's, the styling is not Grafana's."""

from __future__ import annotations

import re
from pathlib import Path

from testbed.prometheus import Prometheus, dashboard_panels, expand

GRID_COLUMNS = 24
LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend(fmt: str | None, labels: dict[str, str], fallback: str) -> str:
    if not fmt:
        inner = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")
        return inner or fallback
    return LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt)


def render(
    prom: Prometheus,
    out: Path,
    *,
    start: float,
    end: float,
    variables: dict[str, str],
    rate_interval: str = "2m",
    title: str = "",
) -> Path:
    """Draw the dashboard over [start, end] (Unix seconds) into ``out`` (PNG)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    panels = dashboard_panels()
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(16, rows * 0.32))
    step = max(5.0, (end - start) / 400)
    for panel in panels:
        g = panel["gridPos"]
        stat = panel["type"] == "stat"
        # margins in grid units: room for the title above, tick labels left and below
        top, bottom, left, right = 0.9, 0.3 if stat else 0.8, 0.2 if stat else 0.9, 0.2
        ax = fig.add_axes(
            (
                (g["x"] + left) / GRID_COLUMNS,
                1 - (g["y"] + g["h"] - bottom) / rows,
                (g["w"] - left - right) / GRID_COLUMNS,
                (g["h"] - top - bottom) / rows,
            )
        )
        ax.set_title(panel["title"], fontsize=8, loc="left")
        ax.tick_params(labelsize=6)
        queries = [
            (t, expand(t["expr"], variables, rate_interval)) for t in panel.get("targets", [])
        ]
        if stat:
            values = [float(s["value"][1]) for _, q in queries for s in prom.query_at(q, end)]
            text = "no data" if not values else f"{sum(values):g}"
            ax.text(0.5, 0.45, text, ha="center", va="center", fontsize=20, transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        drawn = 0
        for target, q in queries:
            for series in prom.query_range(q, start, end, step):
                xs = [(float(t) - start) / 60 for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                name = legend(target.get("legendFormat"), series["metric"], target["refId"])
                ax.plot(xs, ys, lw=1, label=name)
                drawn += 1
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes,
                    fontsize=8, color="grey")  # fmt: skip
        elif drawn <= 8:
            ax.legend(fontsize=5, loc="upper left")
        ax.set_xlim(0, (end - start) / 60)
        ax.grid(alpha=0.3)
    fig.suptitle(title or "jobset-inplace dashboard", fontsize=11, y=1 + 1.2 / rows)
    fig.text(0.5, -0.6 / rows, "x: minutes since the start of the range", ha="center", fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return out
