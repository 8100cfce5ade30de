"""Results of ``python -m bench``: ``results.json``, PNG plots and a text summary."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import profile
from .stats import median_interval, ratio_of_medians

_LATENCY = re.compile(r"reported epoch \d+, .*: (\d+\.\d+) s after process start")


def agent_latencies(log_text: str) -> list[float]:
    """Start-up latencies an agent logged (one line per agent process)."""
    return [float(m.group(1)) for m in _LATENCY.finditer(log_text)]


def nearest_rank(values: list[float], q: float) -> float:
    """The ``q`` quantile (0 < q <= 1) by nearest rank: a value that was measured (with 30
    values p99 is the largest; no interpolation between two recoveries)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def stats(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    ci = median_interval(values) if len(values) > 1 else None
    return {
        "n": len(values),
        **({"median_ci": [round(ci[0], 3), round(ci[1], 3)]} if ci else {}),
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "p99": round(nearest_rank(values, 0.99), 3),
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
        per = dict(m["cpu_s_by_process"])
        if CONTROLLER not in per:  # a run before every window counted it by name
            per[CONTROLLER] = m["controller_cpu_s"]
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


CONTROLLER = "jobset-inplace"  # bench.scenarios.CONTROLLER (no import: the report reads files)
# the paths with phases (a simulated agent fleet)
IN_PLACE = ("hybrid", "hybrid-pod", "leases", "upstream")
OTHERS = ("leases", "upstream", "stock")  # the paths compared with hybrid
# the pod-scope gang (bench.scenarios.POD_SCOPE_PATH) and the paths compared with it
POD_SCOPE = "hybrid-pod"
POD_SCOPE_OTHERS = ("upstream", "stock")
# jobset-inplace's gangs (bench.scenarios.JSI_PATHS)
JSI = ("hybrid", "hybrid-pod", "leases", "spares")
PHASES = ("detection_s", "restart_s", "barrier_s", "barrier_open_s", "protocol_s")
LABEL = {
    "hybrid": "jobset-inplace",
    "hybrid-pod": "jobset-inplace, pod scope",
    "leases": "jobset-inplace, reports on Leases",
    "upstream": "upstream IPR",
    "stock": "stock",
}


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per size: min/median/max of every phase of each path, and the ratios of the other paths'
    medians over the hybrid's."""
    out: dict[str, Any] = {}
    empty: dict[str, Any] = {"worker_failure": [], "node_death": []}
    for size, r in results.get("sizes", {}).items():
        row: dict[str, Any] = {"paths": [p for p in (*IN_PLACE, "stock") if p in r]}
        for path in IN_PLACE:
            runs = r.get(path, empty)["worker_failure"]
            keys = (*PHASES, "all_running_s", "controller_cpu_s", "controller_peak_rss_mib")
            row[f"{path}_worker_failure"] = {k: stats(_col(runs, k)) for k in keys}
        sw = r.get("stock", empty)["worker_failure"]
        row["stock_worker_failure"] = {
            "all_running_s": stats(_col(sw, "all_running_s")),
            "capped": sum(1 for m in sw if m.get("capped")),
        }
        for path in (*IN_PLACE, "stock"):
            runs = r.get(path, empty)["worker_failure"]
            if any("cpu_s_by_process" in m for m in runs):
                row[f"{path}_cores_by_process"] = cores_by_process(runs)
            if any("apiserver_requests" in m for m in runs):
                row[f"{path}_apiserver_requests"] = requests_per_recovery(runs)
        profiles = {
            path: r[path]["profiled"]["apiserver_profile"]["share_pct"]
            for path in (*IN_PLACE, "stock")
            if "share_pct" in r.get(path, {}).get("profiled", {}).get("apiserver_profile", {})
        }
        if profiles:
            row["apiserver_cpu_share_pct"] = profiles
        for base, others in (("hybrid", OTHERS), (POD_SCOPE, POD_SCOPE_OTHERS)):
            hb = row[f"{base}_worker_failure"]["barrier_open_s"]
            ha = row[f"{base}_worker_failure"]["all_running_s"]
            for path in others:
                # stock has no barrier: its time to all running is compared with both
                other = row[f"{path}_worker_failure"]
                ob = other["all_running_s"] if path == "stock" else other["barrier_open_s"]
                oa = other["all_running_s"]
                if hb and ha and ob and oa:
                    key = f"ratio_{path}_over_{base}"
                    row[f"{key}_barrier"] = round(ob["median"] / hb["median"], 1)
                    row[f"{key}_running"] = round(oa["median"] / ha["median"], 1)
                    interval = running_interval(r, path, base)
                    if interval is not None:
                        row[f"{key}_running_interval"] = interval
        pools = {path: fleet_pool(r.get(path, empty)) for path in IN_PLACE}
        if any(pools.values()):
            row["fleet_pool"] = {path: v for path, v in pools.items() if v}
        deaths = node_deaths(r)
        if deaths:
            row["node_death"] = deaths
        out[size] = row
    agent = results.get("agent_start")
    if agent:
        out["agent_start"] = stats(agent["samples_s"])
    return out


def fleet_pool(runs: dict[str, Any]) -> dict[str, Any] | None:
    """Over a path's failures (worker failures and node deaths) at one size: the most of the
    simulated agents' pool busy at once and the longest any task waited for a worker (None:
    a run before the pool was measured)."""
    pools = [
        m["fleet_pool"]
        for kind in ("worker_failure", "node_death")
        for m in runs.get(kind, [])
        if "fleet_pool" in m
    ]
    if not pools:
        return None
    return {
        "failures": len(pools),
        "workers": max(p["workers"] for p in pools),
        "peak_busy": max(p["peak_busy"] for p in pools),
        "wait_max_s": max(p["wait_max_s"] or 0.0 for p in pools),
        "wait_p99_max_s": max(p["wait_p99_s"] or 0.0 for p in pools),
    }


def running_interval(r: dict[str, Any], path: str, base: str = "hybrid") -> dict[str, Any] | None:
    """The 95 % bootstrap interval of ``path``'s ratio to ``base``'s median time to every
    member running (one size's runs ``r``), with both sample counts; None where a side has
    fewer than 2 runs or a capped one (its time is only a lower bound)."""
    theirs = (r.get(path) or {}).get("worker_failure", [])
    ours = (r.get(base) or {}).get("worker_failure", [])
    a, b = _col(theirs, "all_running_s"), _col(ours, "all_running_s")
    if len(a) < 2 or len(b) < 2 or any(m.get("capped") for m in (*theirs, *ours)):
        return None
    x = ratio_of_medians(a, b)
    return {"low": round(x.low, 1), "high": round(x.high, 1), "n": [len(a), len(b)]}


def interval_text(row: dict[str, Any], path: str, base: str = "hybrid") -> str:
    """``; 95 % interval LOW-HIGH, n = A, B`` for a ratio that has one, else ``""``."""
    iv = row.get(f"ratio_{path}_over_{base}_running_interval")
    if not iv:
        return ""
    return f"; 95 % interval {iv['low']}-{iv['high']}, n = {iv['n'][0]}, {iv['n'][1]}"


def node_deaths(r: dict[str, Any]) -> list[dict[str, Any]]:
    """One size's node deaths, a row per kind (path, remediation, ``force-delete``) in the
    order first run: its median over the deaths counted, their 95 % bootstrap interval where
    there are 2 or more and all recovered, n. Ratios only like for like: a peer tainted
    out-of-service over jobset-inplace waiting for the same taint (``force-delete: never``),
    both recovered (with the ratio's interval where both sides have 2 or more)."""
    kinds: dict[tuple[str, str, str | None], list[dict[str, Any]]] = {}
    for path in (*IN_PLACE, "stock"):
        for d in (r.get(path) or {}).get("node_death", []):
            key = (path, d.get("remediation", "none"), d.get("force_delete"))
            kinds.setdefault(key, []).append(d)
    rows = [_death_kind(*key, runs) for key, runs in kinds.items()]
    base = next(
        (
            x
            for x in rows
            if x["path"] == "hybrid"
            and x["remediation"] == "out-of-service"
            and not (x["capped_runs"] or x["invalid"])
        ),
        None,
    )
    for x in rows:
        like = x["path"] in OTHERS and x["remediation"] == "out-of-service"
        if base and like and not (x["capped_runs"] or x["invalid"]):
            x["ratio_over_hybrid"] = round(x["running_s"] / base["running_s"], 1)
            x["ratio_n"] = [x["n"], base["n"]]
            if x["n"] >= 2 and base["n"] >= 2:
                iv = ratio_of_medians(x["values"], base["values"])
                x["ratio_interval"] = [round(iv.low, 1), round(iv.high, 1)]
    return rows


def _death_kind(
    path: str, remediation: str, force_delete: str | None, runs: list[dict[str, Any]]
) -> dict[str, Any]:
    """The row of one kind of node death from its ``runs``. A run marked ``invalid`` (by hand,
    on a stored run whose record a harness bug spoiled, with the reason and the fix's commit)
    is not counted; a kind with none counted is shown with the reason, never a ratio. A capped
    run counts at the cap (a lower bound): the kind "did not recover" where half or more of
    its runs were capped (its median is then a lower bound too)."""
    counted = [d for d in runs if not d.get("invalid")]
    shown = counted or runs
    values = [float(d["running_s"]) for d in shown]
    capped_runs = sum(1 for d in shown if d.get("capped"))

    def med(key: str) -> float | None:
        got = [float(d[key]) for d in shown if d.get(key) is not None]
        return round(statistics.median(got), 2) if got else None

    row: dict[str, Any] = {
        "path": path,
        "remediation": remediation,
        "force_delete": force_delete,
        "n": len(counted),
        "values": values,
        "running_s": round(statistics.median(values), 2),
        "capped": 2 * capped_runs >= len(values),
        "capped_runs": capped_runs,
        "stuck_terminating": max(len(d.get("stuck_terminating", [])) for d in shown),
        "detection_s": med("detection_s"),
        "declared_dead_s": med("declared_dead_s"),
        "out_of_service_s": med("out_of_service_s"),
        "invalid": None if counted else runs[0]["invalid"],
        "not_counted": len(runs) - len(counted),
    }
    if len(counted) >= 2 and not capped_runs:
        row["interval"] = [round(v, 1) for v in median_interval(values)]
    return row


def death_label(x: dict[str, Any]) -> str:
    """A node-death run's path and how the dead node's pod was freed."""
    how = "out-of-service taint" if x["remediation"] == "out-of-service" else "no remediation"
    if x["force_delete"]:
        how = f"force-delete {x['force_delete']}, {how}"
    return f"{LABEL[x['path']]} ({how})"


def death_outcome(x: dict[str, Any]) -> str:
    """Its time, or that it did not recover within the cap (and why, when pods were stuck), or
    why the record does not count."""
    if x.get("invalid"):
        return f"not counted: {x['invalid']}"
    n, capped = x.get("n", 1), x.get("capped_runs", int(x["capped"]))
    if not x["capped"]:
        if "interval" in x:
            low, high = x["interval"]
            return f"{x['running_s']:.1f} s ({low:.1f}-{high:.1f}, n = {n})"
        if n > 1:  # some capped: the median's interval would count a bound as a time
            return f"{x['running_s']:.1f} s (n = {n}, {capped} not within the cap)"
        return f"{x['running_s']:.1f} s"
    stuck = x["stuck_terminating"]
    why = f" ({stuck} pod{'s' * (stuck != 1)} stuck Terminating)" if stuck else ""
    of = f"; {capped} of {n}" if n > 1 else ""
    return f"did not recover within {x['running_s']:.0f} s{why}{of}"


# What the recovery protocol itself writes (the controller and the agents): every other write in
# a window is the cluster's (the simulated kubelets' pod status, node Leases, endpoints).
PROTOCOL_RESOURCES = ("gangstates", "gangstates/status", "events", "pods", "jobsets")
MUTATING = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


def protocol_writes(requests: dict[str, int]) -> int:
    """The recovery protocol's writes among a window's apiserver requests ("VERB resource")."""
    return sum(
        n
        for key, n in requests.items()
        if key.split(" ")[0] in MUTATING and key.split(" ")[-1] in PROTOCOL_RESOURCES
    )


def scale_curve(results: dict[str, Any], summ: dict[str, Any]) -> list[str]:
    """jobset-inplace's worker failure by gang size: p50 and p99 (nearest rank) of barrier open
    and every member running, split into the agents' reports and the controller's own steps
    (detection + barrier); the protocol's writes per recovery, the leader's RSS, and the CPU
    each process spent per recovery (what bounds it on a shared machine)."""
    sizes = [s for s in _sizes(summ) if "hybrid" in summ[s]["paths"]]
    if not sizes:
        return []

    def pq(s: dict[str, Any] | None) -> str:
        if not s:
            return "-"
        ci = s.get("median_ci")
        within = f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else ""
        return f"{s['median']:.2f}{within} / {s['p99']:.2f}"

    out = [
        "",
        "The scale curve (jobset-inplace, one worker fails; seconds, p50 / p99 by nearest rank: "
        "with fewer than 100 repetitions the p99 is the largest, with no interval (n values "
        "cannot bound a quantile beyond their largest); each p50's 95 % bootstrap interval in "
        "parentheses; the leader's peak RSS is the largest over the run, one figure):",
        "",
        "| gang | n | **barrier open** | every member running | of which the agents' stop and "
        "report | the controller's own steps (detection + barrier) | protocol writes per "
        "recovery (median) | leader peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cpu_rows: list[tuple[str, dict[str, dict[str, Any]]]] = []
    for size in sizes:
        w = summ[size]["hybrid_worker_failure"]
        runs = results["sizes"][size]["hybrid"]["worker_failure"]
        writes = [
            protocol_writes(m["apiserver_requests"]) for m in runs if "apiserver_requests" in m
        ]
        own = stats([m["detection_s"] + m["barrier_s"] for m in runs if "barrier_s" in m])
        out.append(
            f"| {size} pods | {(w['barrier_open_s'] or {}).get('n', 0)} "
            f"| **{pq(w['barrier_open_s'])}** | {pq(w['all_running_s'])} "
            f"| {pq(w['restart_s'])} | {pq(own)} "
            f"| {statistics.median(writes) if writes else '-'} "
            f"| {_max(w['controller_peak_rss_mib'])} MiB |"
        )
        cpu_rows.append((size, cpu_per_recovery(runs)))
    procs = sorted(
        {p for _, c in cpu_rows for p in c},
        key=lambda p: (-max(c[p]["median"] if p in c else 0 for _, c in cpu_rows), p),
    )
    if not procs:
        return out
    out += [
        "",
        "CPU-seconds per recovery (median over the windows, failure to every member past the "
        "barrier, with its 95 % bootstrap interval; n as above; the machine has 2 cores):",
        "",
        "| gang | " + " | ".join(procs) + " |",
        "|---|" + "---|" * len(procs),
    ]
    for size, cpu in cpu_rows:
        cells = [_cpu_cell(cpu.get(p)) for p in procs]
        out.append(f"| {size} pods | " + " | ".join(cells) + " |")
    return out


def _cpu_cell(s: dict[str, Any] | None) -> str:
    """``0.52 (0.48-0.57)``; ``0.00`` for a process under the table's floor at that size."""
    if not s:
        return "0.00"
    ci = s.get("median_ci")
    return f"{s['median']:.2f}" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")


def cpu_per_recovery(
    windows: list[dict[str, Any]], least: float = 0.01
) -> dict[str, dict[str, Any]]:
    """CPU-seconds of each process per measured window (those whose median is at least
    ``least``), the jobset-inplace controller included: :func:`stats` of its windows, a window
    without it counted 0; the heaviest first."""
    per: dict[str, list[float]] = {}
    measured = [m for m in windows if "cpu_s_by_process" in m]
    for m in measured:
        cpu = dict(m["cpu_s_by_process"])
        cpu.setdefault(CONTROLLER, m["controller_cpu_s"])
        for proc, v in cpu.items():
            per.setdefault(proc, []).append(v)
    by = {p: stats(v + [0.0] * (len(measured) - len(v))) for p, v in per.items()}
    heavy = sorted(((p, s) for p, s in by.items() if s), key=lambda kv: -kv[1]["median"])
    return {p: s for p, s in heavy if s["median"] >= least}


def _ge(capped: bool) -> str:
    return ">= " if capped else ""


def leader_ms_per_member(results: dict[str, Any]) -> dict[tuple[str, str], list[float]]:
    """(path, size) -> the leader's CPU per member of each recovery, in ms: its CPU less what
    it spends over as long a window with nothing failing (the gang's idle window, if any: node
    Leases, watches), over the gang's size (jobset-inplace's paths)."""
    out: dict[tuple[str, str], list[float]] = {}
    for size, row in results.get("sizes", {}).items():
        for path in JSI:
            if path not in row:
                continue
            runs = _metered(row[path])
            if runs:
                rate = _idle_cores(row[path])
                out[path, size] = [
                    1000 * (m["controller_cpu_s"] - rate * m["window_s"]) / int(size) for m in runs
                ]
    return out


def _metered(block: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in block["worker_failure"] if "controller_cpu_s" in m and "window_s" in m]


def _idle(block: dict[str, Any]) -> dict[str, Any] | None:
    # (a file from before rounds has no blocks)
    return next((b["idle"] for b in block.get("blocks", []) if "idle" in b), None)


def _idle_cores(block: dict[str, Any]) -> float:
    idle = _idle(block)
    return idle["controller_cpu_s"] / idle["seconds"] if idle else 0.0


def leader_cost(results: dict[str, Any]) -> list[str]:
    """The leader's CPU per member per recovery (:func:`leader_ms_per_member`): the median
    with its 95 % bootstrap interval, user and system apart, the planning passes, and where a
    sampled recovery's CPU went."""
    out: list[str] = []
    for (path, size), per in leader_ms_per_member(results).items():
        block = results["sizes"][size][path]
        runs, idle = _metered(block), _idle(block)
        within = ""
        if len(per) >= 2:
            low, high = median_interval(per)
            within = f" (95 % {low:.3f}-{high:.3f})"
        user = statistics.median(_col(runs, "controller_cpu_user_s") or [0.0])
        system = statistics.median(_col(runs, "controller_cpu_system_s") or [0.0])
        idle_text = (
            f"less {_idle_cores(block):.3f} cores while nothing fails ({idle['seconds']:g} s idle)"
            if idle
            else "nothing subtracted (no idle window)"
        )
        passes = _col(runs, "controller_passes")
        share = [
            m["controller_planning_cpu_s"] / m["controller_cpu_s"]
            for m in runs
            if "controller_planning_cpu_s" in m and m["controller_cpu_s"] > 0
        ]
        passes_text = (
            f"; {statistics.median(passes):g} planning passes per recovery, plan() "
            f"{100 * statistics.median(share):.0f} % of the leader's CPU (medians)"
            if passes and share
            else ""
        )
        out.append(
            f"{path} {size} pods: the leader's CPU per member per recovery "
            f"{statistics.median(per):.3f} ms{within}, n = {len(per)}; per recovery user "
            f"{user:.2f} / system {system:.2f} CPU-s (medians), {idle_text}{passes_text}"
        )
        blocks = block.get("blocks", [])
        prof = next((b["leader_profile"] for b in blocks if "leader_profile" in b), None)
        if prof and prof.get("samples"):
            out.append(f"  sampled ({prof['samples']} samples, {len(prof['files'])} recoveries)")
            out += [f"    {line}" for line in prof["inclusive"][:25]]
    return out


def text(results: dict[str, Any]) -> str:
    summ = summarize(results)
    lines = ["", "=== jobset-inplace benchmark (seconds: min / median / max) ==="]
    for size, row in summ.items():
        if size == "agent_start":
            continue
        lines.append(f"gang of {size} pods, one worker fails:")
        for path in IN_PLACE:
            if path not in row["paths"]:
                continue
            w = row[f"{path}_worker_failure"]
            for k in (*PHASES, "all_running_s"):
                lines.append(f"  {path:<8} {k:<22} {_fmt(w[k])}")
            lines.append(
                f"  {path:<8} recovering controller: {_fmt(w['controller_cpu_s'])} CPU-s, "
                f"peak RSS {_fmt(w['controller_peak_rss_mib'])} MiB"
            )
        sw = row["stock_worker_failure"]
        if "stock" in row["paths"]:
            capped = f" ({sw['capped']} capped: >=)" if sw["capped"] else ""
            lines.append(
                f"  {'stock':<8} {'all_running_s':<22} {_fmt(sw['all_running_s'])}{capped}"
            )
        for base, others in (("hybrid", OTHERS), (POD_SCOPE, POD_SCOPE_OTHERS)):
            for path in others:
                key = f"ratio_{path}_over_{base}"
                if f"{key}_barrier" in row:
                    lines.append(
                        f"  ratio {path} / {base}: {row[f'{key}_barrier']}x (to barrier open), "
                        f"{row[f'{key}_running']}x (to all running)"
                    )
        for x in row.get("node_death", []):
            ratio = x.get("ratio_over_hybrid")
            lines.append(
                f"  node death, {death_label(x)}: {death_outcome(x)}"
                + (f" (ratio {ratio}x, like for like)" if ratio else "")
            )
    if summ.get("agent_start"):
        lines.append(f"agent start -> epoch reported (real node): {_fmt(summ['agent_start'])}")
    lines += leader_cost(results)
    return "\n".join(lines)


def _med(s: dict[str, float] | None) -> str:
    return "-" if not s else f"{s['median']:.1f}"


def _max(s: dict[str, float] | None) -> str:
    return "-" if not s else f"{s['max']:.0f}"


def _fmt(s: dict[str, float] | None) -> str:
    if not s:
        return "-"
    return f"{s['min']:.2f} / {s['median']:.2f} / {s['max']:.2f}"


def _fmt_mid(s: dict[str, Any] | None) -> str:
    """``min / median (its interval) / max``; without an interval (one value) as ``_fmt``."""
    if not s or not s.get("median_ci"):
        return _fmt(s)
    low, high = s["median_ci"]
    return f"{s['min']:.2f} / {s['median']:.2f} ({low:.2f}-{high:.2f}) / {s['max']:.2f}"


def _med_ci(s: dict[str, Any] | None) -> str:
    """``median (its interval)``, or the median alone (one value)."""
    if not s or not s.get("median_ci"):
        return _med(s)
    low, high = s["median_ci"]
    return f"{s['median']:.1f} ({low:.1f}-{high:.1f})"


def _fmt_ci(s: dict[str, Any] | None) -> str:
    """``min / median / max (median's interval, n)``"""
    if not s:
        return "-"
    ci = s.get("median_ci")
    return _fmt(s) + (f" ({ci[0]:.2f}-{ci[1]:.2f}, n = {s['n']})" if ci else f" (n = {s['n']})")


def write(out: Path, results: dict[str, Any]) -> list[Path]:
    """results.json and the plots; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {**results, "summary": summarize(results)}
    (out / "results.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    plots = plot(out, results) if results.get("sizes") else []
    return [out / "results.json", *plots]


def require_plots(prog: str) -> None:
    """Stop ``prog`` before it measures anything where its plots could not be drawn at the
    end (matplotlib comes with the bench extra only: ``make bench`` installs it)."""
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        raise SystemExit(
            f"{prog}: matplotlib is missing (the bench extra); install it with "
            "`make .venv/.bench` or `pip install -e '.[bench]'`"
        ) from None


def plot(out: Path, results: dict[str, Any]) -> list[Path]:
    """PNG plots of a run with both paths; none for a one-path run (nothing to compare)."""
    # matplotlib comes with the bench extra only (make bench installs it)
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    sizes = sorted(results["sizes"], key=int)
    summ = summarize(results)
    if any(len(summ[s]["paths"]) < 2 or "hybrid" not in summ[s]["paths"] for s in sizes):
        return []  # a run of one path only: nothing to compare

    written: list[Path] = []
    colors = {
        "hybrid": "tab:blue",
        "hybrid-pod": "tab:purple",
        "leases": "tab:green",
        "upstream": "tab:orange",
        "stock": "grey",
    }
    # 1. worker failure: crash -> every member running, each path, per size
    fig, ax = plt.subplots(figsize=(7, 4))
    paths = [p for p in (*IN_PLACE, "stock") if any(p in summ[s]["paths"] for s in sizes)]
    width = 0.8 / len(paths)
    for j, path in enumerate(paths):
        for i, s in enumerate(sizes):
            st = summ[s][f"{path}_worker_failure"]["all_running_s"]
            if not st:
                continue
            xpos = i - 0.4 + width * (j + 0.5)
            ax.bar(xpos, st["median"], width, color=colors[path], label=LABEL[path] * (i == 0))
            ratio = summ[s].get(f"ratio_{path}_over_hybrid_running")
            note = f"{st['median']:.1f}s" + (f"\n{ratio}x" if ratio else "")
            ax.annotate(note, (xpos, st["median"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(range(len(sizes))), [f"{s} pods" for s in sizes])
    ax.set_ylabel("seconds (median)")
    ax.margins(y=0.15)  # room for the labels above the tallest bar
    ax.set_title("One worker fails: crash -> every member running again")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "worker-failure.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # 2. node death: every path and remediation (a run that did not recover: its cap, hatched)
    rows = [(s, x) for s in sizes for x in summ[s].get("node_death", [])]
    if rows:
        fig, ax = plt.subplots(figsize=(8, 0.8 + 0.45 * len(rows)))
        for s, x in rows:
            label = f"{death_label(x)}, {s} pods"
            hatch = "//" if x["capped"] else None
            ax.barh(label, x["running_s"], color=colors[x["path"]], hatch=hatch)
            note = death_outcome(x).replace("did not recover within", "not within")
            ax.annotate(f" {note}", (x["running_s"], label), va="center", fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("seconds from the node's last heartbeat to the gang running again")
        ax.margins(x=0.45)
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
            {p for _, c in rows3 for p in c}, key=lambda p: (-max(c.get(p, 0) for _, c in rows3), p)
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
    """Every results table of a run (``python -m bench.report``)."""
    summ = summarize(results)
    return "\n".join(
        [
            *worker_failure_tables(summ),
            *scale_curve(results, summ),
            *node_death_table(summ),
            *pool_lines(summ),
            *detail_tables(summ),
        ]
    )


def pool_lines(summ: dict[str, Any]) -> list[str]:
    """Whether the simulated agents' and kubelets' thread pool could have held a path back:
    per size and path, the most workers busy at once and the longest wait for one."""
    out = []
    for size in _sizes(summ):
        pools = summ[size].get("fleet_pool")
        if not pools:
            continue
        each = "; ".join(
            f"{path} ({p['failures']} failures): at most {p['peak_busy']} of {p['workers']} "
            f"busy at once, the longest wait for a worker {p['wait_max_s'] * 1000:.1f} ms "
            f"(p99 of a failure's tasks at most {p['wait_p99_max_s'] * 1000:.1f} ms)"
            for path, p in pools.items()
        )
        out += ["", f"The simulated agents' and kubelets' thread pool, {size} pods: {each}."]
    return out


def _sizes(summ: dict[str, Any]) -> list[str]:
    """The gang sizes of a summary, smallest first (a results file's keys are sorted as text)."""
    return sorted((s for s in summ if s != "agent_start"), key=int)


def worker_failure_tables(summ: dict[str, Any]) -> list[str]:
    """Crash -> every member running by path, with the ratios of one run; the phases."""
    sizes = _sizes(summ)
    # a run with the pod-scope gang beside the hybrid one: its column and its ratios too
    both = any(POD_SCOPE in summ[s]["paths"] for s in sizes)
    header = (
        "| gang | **jobset-inplace** | **jobset-inplace, pod scope** | upstream IPR | stock "
        "| **upstream / jobset-inplace** | **upstream / pod scope** "
        "| **stock / jobset-inplace** | **stock / pod scope** |"
        if both
        else "| gang | **jobset-inplace** | upstream IPR | stock | **upstream / jobset-inplace** "
        "| **stock / jobset-inplace** |"
    )
    out = [
        "One worker fails, crash -> every member running again:",
        "",
        header,
        "|---" * header.count(" | ") + "|---|",
    ]
    for size in sizes:
        row = summ[size]
        ge = _ge(row["stock_worker_failure"]["capped"] > 0)
        ours = ("hybrid", POD_SCOPE) if both else ("hybrid",)
        cells = [
            *(f"**{_fmt_ci(row[f'{p}_worker_failure']['all_running_s'])}**" for p in ours),
            _fmt_ci(row["upstream_worker_failure"]["all_running_s"]),
            ge + _fmt_ci(row["stock_worker_failure"]["all_running_s"]),
        ]
        for path, g in (("upstream", ""), ("stock", ge)):
            for base in ours:
                ratio = row.get(f"ratio_{path}_over_{base}_running")
                iv = interval_text(row, path, base)
                cells.append(f"**{g}{ratio}x**" + (f" ({iv[2:]})" if iv else "") if ratio else "-")
        out.append(f"| {size} pods | " + " | ".join(cells) + " |")
    out += [
        "",
        "Where the time goes (the in-place paths' phases):",
        "",
        "| gang | path | n | detection | restart + report | barrier | **barrier open** "
        "| protocol (minus the simulated restarts) | all running "
        "| recovering controller: jobset-inplace's / JobSet's (median CPU-s, max peak RSS) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in sizes:
        for path in IN_PLACE:
            if path not in summ[size]["paths"]:
                continue
            w = summ[size][f"{path}_worker_failure"]
            n = (w["all_running_s"] or {}).get("n", 0)
            out.append(
                f"| {size} pods | {LABEL[path]} | {n} | {_fmt_mid(w['detection_s'])} "
                f"| {_fmt_mid(w['restart_s'])} | {_fmt_mid(w['barrier_s'])} "
                f"| **{_fmt_mid(w['barrier_open_s'])}** | {_fmt_mid(w['protocol_s'])} "
                f"| {_fmt_mid(w['all_running_s'])} "
                f"| {_med_ci(w['controller_cpu_s'])} CPU-s, "
                f"{_max(w['controller_peak_rss_mib'])} MiB |"
            )
    out.append("")
    out.append(
        "(seconds; in the first table min / median / max with the median's 95 % bootstrap "
        "interval and n, in the second min / median (its 95 % bootstrap interval) / max over "
        "the n repetitions; ratios of the medians; the controller's peak RSS the largest of "
        "the n, one figure per run)"
    )
    return out


def node_death_table(summ: dict[str, Any]) -> list[str]:
    """Every node-death run of every path and remediation."""
    out: list[str] = []
    sizes = _sizes(summ)
    deaths = [(s, x) for s in sizes for x in summ[s].get("node_death", [])]
    if deaths:
        single = all(x.get("n", 1) <= 1 for _, x in deaths)
        how = (
            "one death a cell: no interval, a single sample each, not a verdict"
            if single
            else "each cell the median of that kind's deaths with its 95 % bootstrap interval "
            "and n, the ratio of the medians with its interval (a kind that did not recover "
            "within the cap is not run again: another would take the cap for the same verdict)"
        )
        out += [
            "",
            "One node dies (its heartbeat stops), -> the gang running again; ratios only like "
            f"for like (the same remediation, both recovered); {how}:",
            "",
            "| gang | path (how the dead node's pod is freed) | node declared dead "
            "| **-> gang running** | **/ jobset-inplace** |",
            "|---|---|---|---|---|",
        ]
        for size, x in deaths:
            dead = x["declared_dead_s"]
            out.append(
                f"| {size} pods | {death_label(x)} | {'-' if dead is None else f'{dead:.1f} s'} "
                f"| **{death_outcome(x)}** | {death_ratio(x)} |"
            )
    return out


def death_ratio(x: dict[str, Any]) -> str:
    """``**1.6x** (1.4-1.9, n = 5, 5)``, ``**1.6x** (n = 1, 1)``, or ``-`` (no like for like)."""
    ratio = x.get("ratio_over_hybrid")
    if not ratio:
        return "-"
    a, b = x.get("ratio_n", [1, 1])
    iv = x.get("ratio_interval")
    return f"**{ratio}x** ({f'{iv[0]}-{iv[1]}, ' if iv else ''}n = {a}, {b})"


def detail_tables(summ: dict[str, Any]) -> list[str]:
    """CPU by process, apiserver requests and profiles per path, the agent's start-up."""
    out: list[str] = []
    for path in (*IN_PLACE, "stock"):
        out += _by_size_table(
            summ,
            f"{path}_cores_by_process",
            f"Cores used per process during a {LABEL[path]} worker-failure recovery (median "
            "over the repetitions; the machine has 2):",
            "process",
            lambda v: f"{v:.2f}",
        )
    for path in IN_PLACE:
        out += _by_size_table(
            summ,
            f"{path}_apiserver_requests",
            f"apiserver requests during one {LABEL[path]} worker-failure recovery, all clients "
            "(median):",
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
    return out


def _category_order(name: str) -> int:
    names = list(profile.CATEGORIES)
    return names.index(name) if name in names else len(names)


def _by_size_table(
    summ: dict[str, Any], key: str, title: str, what: str, fmt: Callable[[Any], str]
) -> list[str]:
    """A table of ``summ[size][key]`` (a mapping): one row per entry, one column per size."""
    cols = [s for s in _sizes(summ) if key in summ[s]]
    if not cols:
        return []
    names = sorted(
        {n for s in cols for n in summ[s][key]},
        key=lambda n: (-max(summ[s][key].get(n, 0) for s in cols), n),
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
