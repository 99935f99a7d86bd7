"""The end-to-end benchmark's report: speedups (paired with plain when timed so), the tables, the
issue's goals met or not, the terminal view and the BENCHMARKS.md section. Used by bench/e2e.py."""
from __future__ import annotations

import math
import statistics
from collections import Counter

from e2e_models import cell

VARIANTS = ("plain", "plain A/A", "compile", "max-autotune", "tunedb system", "tunedb system+compile", "tunedb tuned",
            "tunedb+compile")
TUNEDB_VARIANTS = tuple(v for v in VARIANTS if v.startswith("tunedb"))
# a compiled tunedb variant is judged against the compiler alone: the compiler's gain is not ours
COMPILED_VARIANTS = ("tunedb system+compile", "tunedb+compile")


def speedup(c: dict, plain: dict | None) -> float | None:
    """plain / variant: the median of the per-round ratios when the cell has them (ratio), else
    against the plain time paired with the variant in the same rounds (plain_ms), else against
    the plain cell's own time."""
    if c.get("status") != "ok" or not c.get("ms"):
        return None
    if c.get("ratio"):
        return c["ratio"]
    base = c.get("plain_ms")
    if base is None and plain and plain.get("status") == "ok":
        base = plain.get("ms")
    return base / c["ms"] if base else None


def fmt(c: dict, plain: dict | None) -> str:
    if c["status"] == "ok":
        x = speedup(c, plain) if plain is not None else None
        return f"{c['ms']:.3f}" + (f" ({x:.2f}x{'' if c.get('plain_ms') else ', unpaired'})" if x else "")
    if c["status"] == "wrong":
        return f"wrong (err {c.get('err', math.nan):.1e})"
    return f"{c['status']}" + (f": {c['note']}" if c.get("note") else "")


def vs_inductor(tune: dict, ind: dict) -> float | None:
    """A tune's wall time over max-autotune's compile, when both ran to the end."""
    if tune.get("seconds") and ind.get("complete") and ind.get("seconds"):
        return tune["seconds"] / ind["seconds"]
    return None


def tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) per model, then the tuning-cost table."""
    out = []
    for name, r in report["models"].items():
        rows = []
        for row in r["rows"]:
            plain = row["cells"]["plain"]
            rows.append([str(row["batch"]), row["mode"]] + [
                fmt(row["cells"].get(v, cell("skipped")), plain if v != "plain" else None) for v in VARIANTS])
        out.append((f"{r['label']}: ms per forward (speedup vs plain timed in the same interleaved rounds)",
                    ["batch", "mode", *VARIANTS], rows))
    rows = []
    for name, r in report["models"].items():
        t, ind, tri = r.get("tuning", {}), r.get("inductor_compile", {}), r.get("triton_autotune", {})
        q = vs_inductor(t, ind)
        ratio = f"{q:.3f}" if q is not None else "n/a"
        tuned = (f"error: {t['error'][:80]}" if "error" in t else
                 f"{t['seconds']} s ({t['method']}, {t['points']} points)" if t else "not run")
        comp = r.get("tunedb_compile", {}).get("per_batch", {})
        opts = ", ".join(f"{k}={v}" for k, v in r.get("tunedb_compile", {}).get("options", {}).items())
        ip = r.get("tuning_in_process", {})
        q = vs_inductor(ip, ind)
        in_proc = (f"{ip['seconds']} s ({q:.3f})" if q is not None else
                   f"{ip['seconds']} s" if ip.get("seconds") else "error" if ip else "not run")
        rows.append([name, tuned,
                     f"{ind['seconds']} s ({len(ind['per_batch'])} of {len(r['batches'])} batches)" if ind else "not run",
                     f"{tri['seconds']:.1f} s ({tri['how']})" if tri else "not run", ratio, in_proc,
                     (f"{sum(comp.values()):.1f} s ({len(comp)} of {len(r['batches'])} batches"
                      f"{', ' + opts if opts else ''})") if comp else "not run"])
    out.append(("Tuning cost (wall seconds, the benchmarked batches)",
                ["model", "tunedb tune", "Inductor max-autotune compile", "triton.autotune", "tunedb / Inductor",
                 "tunedb tune in process (/ Inductor)", "torch.compile of the tuned model (default mode + options)"], rows))
    return out


def goals(report: dict) -> list[str]:
    """The issue's goals, met or not, with the numbers (each tunedb variant on its own)."""
    lines = []
    aa = {}  # mode -> worst |1 - plain A/A|: the noise floor a 1% criterion sits on
    for r in report["models"].values():
        for row in r["rows"]:
            x = speedup(row["cells"].get("plain A/A", {}), row["cells"]["plain"])
            if x:
                aa[row["mode"]] = max(aa.get(row["mode"], 0.0), abs(1.0 - x))
    if aa:
        lines.append("noise floor: plain timed against itself (A/A, in the first phase, before any compile) "
                     "strays up to " + ", ".join(f"{100 * d:.1f}% in {m}" for m, d in sorted(aa.items()))
                     + "; a gap inside that is not a measured difference (after compiles the host is busier)")
    for v in TUNEDB_VARIANTS:
        vs = {"plain": [], "max-autotune": []}
        for r in report["models"].values():
            for row in r["rows"]:
                c = row["cells"]
                mine = speedup(c.get(v, {}), c["plain"])
                theirs = speedup(c.get("max-autotune", {}), c["plain"])
                at = f"{r['name']} b{row['batch']} {row['mode']}"
                if mine:
                    vs["plain"].append((mine, at))
                    if theirs:  # both paired with plain: the ratio of two same-run ratios
                        vs["max-autotune"].append((mine / theirs, at))
        if vs["plain"]:
            (worst, at), geo = min(vs["plain"]), math.exp(statistics.fmean(math.log(x) for x, _ in vs["plain"]))
            lines.append(f"{v}: never slower than plain beyond 1%: {'met' if worst >= 0.99 else 'NOT met'} (worst "
                         f"{worst:.3f}x at {at}); geomean >= 1.05x: {'met' if geo >= 1.05 else 'NOT met'} "
                         f"({geo:.3f}x over {len(vs['plain'])} rows)")
        if vs["max-autotune"]:
            worst, at = min(vs["max-autotune"])
            lines.append(f"{v}: never slower than max-autotune (1% band): {'met' if worst >= 0.99 else 'NOT met'} "
                         f"(worst {worst:.3f}x at {at}, {len(vs['max-autotune'])} rows)")
    for v in COMPILED_VARIANTS:
        vs = [(mine / base, f"{r['name']} b{row['batch']} {row['mode']}")
              for r in report["models"].values() for row in r["rows"]
              for mine, base in [(speedup(row["cells"].get(v, {}), row["cells"]["plain"]),
                                  speedup(row["cells"].get("compile", {}), row["cells"]["plain"]))] if mine and base]
        if vs:
            (worst, at), geo = min(vs), math.exp(statistics.fmean(math.log(x) for x, _ in vs))
            lines.append(f"{v} vs compile (same Inductor mode and options): never below 0.99x: "
                         f"{'met' if worst >= 0.99 else 'NOT met'} (worst {worst:.3f}x at {at}); geomean {geo:.3f}x "
                         f"over {len(vs)} rows")
    h = report.get("host_overhead")
    if h:
        lines.append(f"selection <= 1 us per call over the bound launcher: "
                     f"{'met' if h['selection_us'] <= 1.0 else 'NOT met'} ({h['selection_us']:.2f} us)")
    for name, r in report["models"].items():
        t, ind = r.get("tuning", {}), r.get("inductor_compile", {})
        q = vs_inductor(t, ind)
        if q is not None:
            lines.append(f"{name}: tuning <= 1/10 of max-autotune compile: {'met' if q <= 0.1 else 'NOT met'} "
                         f"({t['seconds']:.1f} s ({t['method']}) vs {ind['seconds']:.1f} s)")
        ip = r.get("tuning_in_process", {})
        q = vs_inductor(ip, ind)
        if q is not None:
            lines.append(f"{name}: tuning in process (no worker) <= 1/10 of max-autotune compile: "
                         f"{'met' if q <= 0.1 else 'NOT met'} ({ip['seconds']:.1f} s, ratio {q:.3f}; phases: "
                         + ", ".join([f"plan {ip.get('plan_s', 0):.2f}"]
                                     + [f"{k} {v:.2f}" for k, v in ip.get("phase_seconds", {}).items()]) + ")")
        elif ip.get("error"):
            lines.append(f"{name}: tuning in process failed: {ip['error'][:120]}")
        for v in ("tunedb system", "tunedb tuned"):  # which tiers and configs served (eager cells)
            tiers, cfgs = Counter(), Counter()
            for row in r["rows"]:
                if row["mode"] == "eager":
                    tiers.update(row["cells"].get(v, {}).get("tiers", {}))
                    cfgs.update(row["cells"].get(v, {}).get("configs", {}))
            if tiers:
                lines.append(f"{name} {v} served: tiers {dict(tiers)}; configs {dict(cfgs)}")
        if t.get("phase_seconds"):  # where the tune's wall time went (the build's phases)
            parts = [f"plan {t['plan_s']:.2f}"] if "plan_s" in t else []
            parts += [f"{k} {v:.2f}" for k, v in t["phase_seconds"].items()]
            if t.get("confirm"):
                parts.append(f"confirm {t['confirm']['seconds']:.2f}")
            lines.append(f"{name} tune phases (s): {', '.join(parts)} of {t.get('seconds', 0):.2f}")
        c = t.get("confirm")
        if c:  # the tune's in-model check of its Triton picks (tunedb.confirm)
            lines.append(f"{name} confirm ({c['seconds']:.1f} s of the tune): "
                         + ("; ".join(c["verdicts"]) or "no Triton pick to judge"))
    return lines or ["no goal could be evaluated (nothing timed)"]


def show(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    for title, header, rows in tables(report):
        t = Table(title=title)
        for h in header:
            t.add_column(h)
        for row in rows:
            t.add_row(*row)
        console.print(t)
    for line in goals(report) + [f"skipped: {s}" for s in report["skipped"]]:
        console.print(line)


def markdown(report: dict) -> str:
    e = report["env"]
    md = [f"\n## End to end: plain vs max-autotune vs tunedb ({report['utc']})\n",
          f"GPU {e['gpu']}; torch {e['torch']}, Triton {e['triton']}, Python {e['python']}. "
          f"Clocks before: `{e['clocks_before']}`; after: `{e['clocks_after']}`.",
          f"Command: `{report['command']}` ({report['wall_s']:.0f} s wall). Eager: median per-forward CUDA-event "
          f"time; graph: the whole forward captured, median per-replay time; bf16, random weights.\n"]
    for title, header, rows in tables(report):
        md += [f"**{title}**\n", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        md += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    h = report.get("host_overhead")
    if h:
        md.append(f"Host cost per call (M,N,K = {h['shape']}, {h['config']} from {h['tier']}): " +
                  ", ".join(f"{k} {v:.2f} us" for k, v in h["us_per_call"].items()) + "\n")
    md += [f"- {g}" for g in goals(report)] + [f"- skipped: {s}" for s in report["skipped"]]
    return "\n".join(md) + "\n"
