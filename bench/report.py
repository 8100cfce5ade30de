"""Results of ``python -m bench``: ``results.json``, PNG plots and a text summary."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import profile

_LATENCY = re.compile(r"reported epoch \d+, .*: (\d+\.\d+) s after process start")


def agent_latencies(log_text: str) -> list[float]:
    """Start-up latencies an agent logged (one line per agent process)."""
    return [float(m.group(1)) for m in _LATENCY.finditer(log_text)]


def stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "n": len(values),
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def _col(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in runs if key in r]


def cores_by_process(windows: list[dict[str, Any]]) -> dict[str, float]:
    """Median cores each process used during the measured windows (CPU-s / window s)."""
    cores: dict[str, list[float]] = {}
    for m in windows:
        if "cpu_s_by_process" not in m:
            continue
        per = {**m["cpu_s_by_process"], "jobset-inplace controller": m["controller_cpu_s"]}
        for proc, cpu in per.items():
            cores.setdefault(proc, []).append(cpu / m["window_s"])
    med = {p: round(statistics.median(v), 2) for p, v in cores.items()}
    return dict(sorted(med.items(), key=lambda kv: -kv[1]))


def requests_per_recovery(windows: list[dict[str, Any]], top: int = 10) -> dict[str, int]:
    """Median apiserver requests (verb resource) per measured window, the ``top`` most."""
    counts: dict[str, list[int]] = {}
    measured = [m["apiserver_requests"] for m in windows if "apiserver_requests" in m]
    for req in measured:
        for key, n in req.items():
            counts.setdefault(key, []).append(n)
    med = {k: int(statistics.median(v + [0] * (len(measured) - len(v)))) for k, v in counts.items()}
    return dict(sorted(med.items(), key=lambda kv: -kv[1])[:top])


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per size: min/median/max of every phase, and the ratios stock / hybrid (medians)."""
    out: dict[str, Any] = {}
    for size, r in results.get("sizes", {}).items():
        empty: dict[str, Any] = {"worker_failure": [], "node_death": []}
        h, s = r.get("hybrid", empty), r.get("stock", empty)
        hw, sw = h["worker_failure"], s["worker_failure"]
        row: dict[str, Any] = {
            "hybrid_worker_failure": {
                k: stats(_col(hw, k))
                for k in (
                    "detection_s",
                    "restart_s",
                    "barrier_s",
                    "barrier_open_s",
                    "protocol_s",
                    "all_running_s",
                    "controller_cpu_s",
                    "controller_peak_rss_mib",
                )
            },
            "stock_worker_failure": {
                "all_running_s": stats(_col(sw, "all_running_s")),
                "capped": sum(1 for m in sw if m.get("capped")),
            },
        }
        if any("cpu_s_by_process" in m for m in hw):
            row["hybrid_cores_by_process"] = cores_by_process(hw)
        if any("apiserver_requests" in m for m in hw):
            row["hybrid_apiserver_requests"] = requests_per_recovery(hw)
        profiles = {
            path: r[path]["profiled"]["apiserver_profile"]["share_pct"]
            for path in ("hybrid", "stock")
            if "share_pct" in r.get(path, {}).get("profiled", {}).get("apiserver_profile", {})
        }
        if profiles:
            row["apiserver_cpu_share_pct"] = profiles
        hb, sb = stats(_col(hw, "barrier_open_s")), stats(_col(sw, "all_running_s"))
        ha = stats(_col(hw, "all_running_s"))
        if hb and sb and ha:
            row["ratio_stock_over_hybrid_barrier"] = round(sb["median"] / hb["median"], 1)
            row["ratio_stock_over_hybrid_running"] = round(sb["median"] / ha["median"], 1)
        if h["node_death"] and s["node_death"]:
            hn, sn = h["node_death"][0], s["node_death"][0]
            row["node_death"] = {
                "hybrid_running_s": hn["running_s"],
                "hybrid_detection_s": hn["detection_s"],
                "stock_running_s": sn["running_s"],
                "stock_capped": sn.get("capped", False),
                "stock_stuck_terminating": len(sn.get("stuck_terminating", [])),
                "ratio_stock_over_hybrid": round(sn["running_s"] / hn["running_s"], 1),
            }
        out[size] = row
    agent = results.get("agent_start")
    if agent:
        out["agent_start"] = stats(agent["samples_s"])
    return out


def text(results: dict[str, Any]) -> str:
    summ = summarize(results)
    lines = ["", "=== jobset-inplace benchmark (seconds: min / median / max) ==="]
    for size, row in summ.items():
        if size == "agent_start":
            continue
        hw, sw = row["hybrid_worker_failure"], row["stock_worker_failure"]
        lines.append(f"gang of {size} pods, one worker fails:")
        for k in ("detection_s", "restart_s", "barrier_s", "barrier_open_s", "protocol_s"):
            lines.append(f"  hybrid {k:<22} {_fmt(hw[k])}")
        lines.append(f"  hybrid {'all_running_s':<22} {_fmt(hw['all_running_s'])}")
        capped = f" ({sw['capped']} capped: >=)" if sw["capped"] else ""
        lines.append(f"  stock  {'all_running_s':<22} {_fmt(sw['all_running_s'])}{capped}")
        if "ratio_stock_over_hybrid_barrier" in row:
            lines.append(
                f"  ratio stock / hybrid: {row['ratio_stock_over_hybrid_barrier']}x (to barrier "
                f"open), {row['ratio_stock_over_hybrid_running']}x (to all running)"
            )
        lines.append(
            f"  controller per recovery: {_fmt(hw['controller_cpu_s'])} CPU-s, peak RSS "
            f"{_fmt(hw['controller_peak_rss_mib'])} MiB"
        )
        nd = row.get("node_death")
        if nd:
            ge = ">= " if nd["stock_capped"] else ""
            lines.append(
                f"  node death: hybrid {nd['hybrid_running_s']:.1f}s (detected "
                f"{nd['hybrid_detection_s']:.1f}s), stock {ge}{nd['stock_running_s']:.1f}s, "
                f"ratio {ge}{nd['ratio_stock_over_hybrid']}x"
            )
    if summ.get("agent_start"):
        lines.append(f"agent start -> epoch reported (real node): {_fmt(summ['agent_start'])}")
    return "\n".join(lines)


def _med(s: dict[str, float] | None) -> str:
    return "-" if not s else f"{s['median']:.1f}"


def _max(s: dict[str, float] | None) -> str:
    return "-" if not s else f"{s['max']:.0f}"


def _fmt(s: dict[str, float] | None) -> str:
    if not s:
        return "-"
    return f"{s['min']:.2f} / {s['median']:.2f} / {s['max']:.2f}"


def write(out: Path, results: dict[str, Any]) -> list[Path]:
    """results.json and the plots; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {**results, "summary": summarize(results)}
    (out / "results.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    plots = plot(out, results) if results.get("sizes") else []
    return [out / "results.json", *plots]


def plot(out: Path, results: dict[str, Any]) -> list[Path]:
    """PNG plots of a run with both paths; none for a one-path run (nothing to compare)."""
    # matplotlib comes with the bench extra only (make bench installs it)
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    sizes = sorted(results["sizes"], key=int)
    summ = summarize(results)
    if any(
        summ[s]["hybrid_worker_failure"]["barrier_open_s"] is None
        or summ[s]["stock_worker_failure"]["all_running_s"] is None
        for s in sizes
    ):
        return []  # a run of one path only: nothing to compare

    written: list[Path] = []
    # 1. worker failure: hybrid phases (stacked medians) next to stock, per size
    fig, ax = plt.subplots(figsize=(7, 4))
    x = range(len(sizes))
    bottom = [0.0] * len(sizes)
    for key, label in (
        ("detection_s", "hybrid: detection"),
        ("restart_s", "hybrid: restart + report"),
        ("barrier_s", "hybrid: barrier"),
    ):
        vals = [summ[s]["hybrid_worker_failure"][key]["median"] for s in sizes]
        ax.bar([i - 0.2 for i in x], vals, 0.4, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    stock = [summ[s]["stock_worker_failure"]["all_running_s"]["median"] for s in sizes]
    ax.bar([i + 0.2 for i in x], stock, 0.4, label="stock JobSet restart", color="grey")
    for i, s in enumerate(sizes):
        ratio = summ[s].get("ratio_stock_over_hybrid_barrier")
        if ratio:
            ax.annotate(f"{ratio}x", (i + 0.2, stock[i]), ha="center", va="bottom")
    ax.set_xticks(list(x), [f"{s} pods" for s in sizes])
    ax.set_ylabel("seconds (median)")
    ax.set_title("One worker fails: first signal -> gang resumed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "worker-failure.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # 2. node death
    rows = [(s, summ[s]["node_death"]) for s in sizes if "node_death" in summ[s]]
    if rows:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        labels, vals, colors = [], [], []
        for s, nd in rows:
            labels += [f"hybrid\n{s} pods", f"stock\n{s} pods"]
            vals += [nd["hybrid_running_s"], nd["stock_running_s"]]
            colors += ["tab:blue", "grey"]
        bars = ax.bar(labels, vals, color=colors)
        for b, (_, nd) in zip(bars[1::2], rows, strict=True):
            ge = ">= " if nd["stock_capped"] else ""
            ax.annotate(
                f"{ge}{nd['stock_running_s']:.0f}s", (b.get_x() + 0.4, b.get_height()), ha="center"
            )
        for b, (_, nd) in zip(bars[0::2], rows, strict=True):
            ax.annotate(
                f"{nd['hybrid_running_s']:.0f}s", (b.get_x() + 0.4, b.get_height()), ha="center"
            )
        ax.set_ylabel("seconds to the gang running again")
        ax.set_title("One node dies")
        fig.tight_layout()
        written.append(out / "node-death.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    # 3. where the 2 cores went during a hybrid recovery
    rows3 = [
        (s, summ[s]["hybrid_cores_by_process"])
        for s in sizes
        if "hybrid_cores_by_process" in summ[s]
    ]
    if rows3:
        procs = sorted(
            {p for _, c in rows3 for p in c}, key=lambda p: -max(c.get(p, 0) for _, c in rows3)
        )
        fig, ax = plt.subplots(figsize=(7, 1.2 + 0.7 * len(rows3)))
        left = [0.0] * len(rows3)
        for proc in procs:
            vals = [c.get(proc, 0.0) for _, c in rows3]
            ax.barh([f"{s} pods" for s, _ in rows3], vals, left=left, label=proc)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        ax.set_xlabel("cores (CPU-seconds / second of the recovery; the machine has 2)")
        ax.set_title("Hybrid recovery: CPU by process (median window)")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        written.append(out / "cpu-by-process.png")
        fig.savefig(written[-1], dpi=110, bbox_inches="tight")
        plt.close(fig)
    return written


def markdown(results: dict[str, Any]) -> str:
    """The results tables of docs/benchmarks.md (``python -m bench.report``)."""
    summ = summarize(results)
    out = [
        "| gang | hybrid: detection | restart + report | barrier | **barrier open** "
        "| protocol (minus the simulated restart) | all running | **stock: all running** "
        "| **stock / hybrid** | controller (median CPU-s, max peak RSS) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size, row in summ.items():
        if size == "agent_start":
            continue
        hw, sw = row["hybrid_worker_failure"], row["stock_worker_failure"]
        ge = ">= " if sw["capped"] else ""
        ratio = row.get("ratio_stock_over_hybrid_barrier")
        ratio_cell = f"**{ge}{ratio}x**" if ratio else "- (one path only)"
        out.append(
            f"| {size} pods | {_fmt(hw['detection_s'])} | {_fmt(hw['restart_s'])} "
            f"| {_fmt(hw['barrier_s'])} | **{_fmt(hw['barrier_open_s'])}** "
            f"| {_fmt(hw['protocol_s'])} | {_fmt(hw['all_running_s'])} "
            f"| **{ge}{_fmt(sw['all_running_s'])}** | {ratio_cell} "
            f"| {_med(hw['controller_cpu_s'])} CPU-s, {_max(hw['controller_peak_rss_mib'])} MiB |"
        )
    out.append("")
    out.append("(seconds, min / median / max over the repetitions; ratio of the medians)")
    deaths = [
        (s, r["node_death"]) for s, r in summ.items() if s != "agent_start" and "node_death" in r
    ]
    if deaths:
        out += [
            "",
            "| gang | hybrid: node death -> detected | **-> gang running** "
            "| **stock -> gang running** | **stock / hybrid** | stock pods stuck Terminating |",
            "|---|---|---|---|---|---|",
        ]
        for size, nd in deaths:
            ge = ">= " if nd["stock_capped"] else ""
            hybrid, stock = nd["hybrid_running_s"], nd["stock_running_s"]
            out.append(
                f"| {size} pods | {nd['hybrid_detection_s']:.1f} | **{hybrid:.1f}** "
                f"| **{ge}{stock:.1f}** | **{ge}{nd['ratio_stock_over_hybrid']}x** "
                f"| {nd['stock_stuck_terminating']} |"
            )
    out += _by_size_table(
        summ,
        "hybrid_cores_by_process",
        "Cores used per process during a hybrid worker-failure recovery (median over the "
        "repetitions; the machine has 2):",
        "process",
        lambda v: f"{v:.2f}",
    )
    out += _by_size_table(
        summ,
        "hybrid_apiserver_requests",
        "apiserver requests during one hybrid worker-failure recovery, all clients (median):",
        "request",
        str,
    )
    for size, row in summ.items():
        shares = row.get("apiserver_cpu_share_pct") if size != "agent_start" else None
        if not shares:
            continue
        paths = sorted(shares)
        out += [
            "",
            f"kube-apiserver CPU profile at {size} pods (pprof over the first seconds of an "
            "extra, unmeasured recovery of each path; share of the sampled CPU whose stack "
            "includes it):",
            "",
            "| what | " + " | ".join(paths) + " |",
            "|---|" + "---|" * len(paths),
        ]
        for cat in sorted(shares[paths[0]], key=_category_order):
            cells = [f"{shares[p].get(cat, 0):.0f} %" for p in paths]
            out.append(f"| {cat} | " + " | ".join(cells) + " |")
    if summ.get("agent_start"):
        a = summ["agent_start"]
        out += [
            "",
            f"Agent process start -> epoch reported on the real node: {_fmt(a)} s (n={a['n']}).",
        ]
    return "\n".join(out)


def _category_order(name: str) -> int:
    names = list(profile.CATEGORIES)
    return names.index(name) if name in names else len(names)


def _by_size_table(
    summ: dict[str, Any], key: str, title: str, what: str, fmt: Callable[[Any], str]
) -> list[str]:
    """A table of ``summ[size][key]`` (a mapping): one row per entry, one column per size."""
    cols = [s for s in summ if s != "agent_start" and key in summ[s]]
    if not cols:
        return []
    names = sorted(
        {n for s in cols for n in summ[s][key]},
        key=lambda n: -max(summ[s][key].get(n, 0) for s in cols),
    )
    out = ["", title, "", f"| {what} | " + " | ".join(f"{s} pods" for s in cols) + " |"]
    out.append("|---|" + "---|" * len(cols))
    for n in names:
        cells = [fmt(summ[s][key][n]) if n in summ[s][key] else "-" for s in cols]
        out.append(f"| `{n}` | " + " | ".join(cells) + " |")
    return out


if __name__ == "__main__":
    import sys

    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/bench/results.json")
    print(markdown(json.loads(path.read_text())))
