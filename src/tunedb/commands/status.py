"""`tunedb status [--arch ARCH] [--json]`: per tier, which database files load, which are skipped, what is stale.

Without a GPU every arch family found is shown unless --arch narrows it; with one, the current
device's arch family. Also lists the TUNEDB_* settings in effect, marking any value the package
would refuse (every other command stops on it). Always exits 0.
"""
from __future__ import annotations

import argparse
import json
import re


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", metavar="ARCH", default=None,
                        help="only this arch family (e.g. sm90); default: the GPU's, or all without one")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _default_arch() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            from tunedb.runtime.selector import current_arch_family

            return current_arch_family()
    except Exception:  # no usable torch: show every arch family
        pass
    return None


_ARCH = re.compile(r"^sm[0-9]{2,3}[a-z]?$")  # an arch family as arch_family_of names it: sm80, sm90, sm100


def run(args: argparse.Namespace) -> int:
    from tunedb import database, settings
    from tunedb.errors import TunedbError

    if args.arch is not None and not _ARCH.match(args.arch):
        raise TunedbError(f"--arch {args.arch!r} is not an arch family; one looks like sm80, sm89, sm90 or sm100 "
                          "(sm<major><minor>, the compute capability)")
    with settings.lenient():  # report bad values, do not stop on them
        arch = args.arch if args.arch is not None else _default_arch()
        rep = database.report(arch)
    invalid = settings.problems()
    if args.json:
        print(json.dumps({**rep.to_json(), "invalid_settings": invalid, "unknown_settings": settings.unknown()},
                         indent=2))
    else:
        _render(rep, invalid)
    return 0


def _render(rep, invalid: dict[str, str] | None = None) -> None:
    invalid = invalid or {}
    from rich.console import Console
    from rich.markup import escape as esc  # paths, problems and values are text, never markup
    from rich.table import Table

    console = Console()
    env = ", ".join(f"{k}={v}" for k, v in sorted(rep.environment.items())) or "unknown"
    shown = rep.arch_filter or "all arch families"
    console.print(f"tunedb status ({esc(shown)}); this environment: {esc(env)}")
    for tier in rep.tiers:
        if tier.root is None:
            console.print(f"[bold]{tier.tier} tier[/bold]: disabled (TUNEDB_USER_DB=off)")
            continue
        table = Table(title=esc(f"{tier.tier} tier: {tier.root}"), title_justify="left")
        for col in ("arch", "family", "state", "entries", "stale", "path / why"):
            table.add_column(col, overflow="fold")
        for f in tier.files:
            if f.state == "loaded":
                # Stale entries usually share their reasons: count each distinct one.
                counts: dict[str, int] = {}
                for _sig, reasons in f.stale:
                    for reason in reasons:
                        counts[reason] = counts.get(reason, 0) + 1
                why = "; ".join(f"{r} x{n}" for r, n in counts.items())
                table.add_row(esc(f.arch_family), esc(f.kernel_family), "loaded", str(f.entries),
                              str(len(f.stale)), esc(f"{f.path}" + (f"\nstale: {why}" if why else "")))
            else:
                table.add_row(esc(f.arch_family), esc(f.kernel_family), f"[red]skipped ({esc(f.state)})[/red]",
                              "-", "-", esc(f.problem))
        if not tier.files:
            table.add_row("-", "-", "no files", "-", "-", "")
        console.print(table)
    settings_table = Table(title="settings", title_justify="left")
    for col in ("variable", "value", "meaning"):
        settings_table.add_column(col, overflow="fold")
    for name, value, doc in rep.settings:
        if name in invalid:
            settings_table.add_row(f"[red]{esc(name)}[/red]", f"[red]{esc(value)} (INVALID)[/red]",
                                   esc(invalid[name]))
        else:
            settings_table.add_row(esc(name), esc(value or "(unset)"), esc(doc))
    from tunedb import settings

    for name, why in settings.unknown().items():  # a misspelled name: nothing reads it
        settings_table.add_row(f"[yellow]{esc(name)}[/yellow]", "[yellow](UNKNOWN)[/yellow]", esc(why))
    console.print(settings_table)
    if invalid:
        console.print(f"[red]{len(invalid)} invalid setting(s)[/red]: every other tunedb command refuses "
                      f"to start until they are fixed", highlight=False)
