"""The `tunedb` command line: one subcommand per job, each implemented by the module that owns it.

Each subcommand names a module that defines ``configure(parser)`` and ``run(args) -> int``.
Modules are imported only when their subcommand is chosen (or for --help), so the CLI
never touches torch or the GPU for commands that do not need them.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import warnings
from typing import Any

from tunedb.errors import DatabaseWarning, TunedbError, TunedbWarning

# Exit status of a command whose reader went away (`tunedb diff A B | head`): what a shell
# reports for a process ended by SIGPIPE (128 + 13).
EXIT_BROKEN_PIPE = 141

# name -> (module with configure/run, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "tune": ("tunedb.commands.tune", "census + build + evaluate a workload (the main job)"),
    "census": ("tunedb.commands.census", "record which kernel calls (shapes) a workload runs"),
    "build": ("tunedb.commands.build", "measure a census and write a tuning database"),
    "evaluate": ("tunedb.commands.evaluate", "regret of each selector against the measured oracle"),
    "status": ("tunedb.commands.status", "which database files each tier loads, and which are stale"),
    "diff": ("tunedb.commands.diff", "compare two database files entry by entry"),
    "prebuild": ("tunedb.commands.prebuild", "compile a family's kernels without a GPU into a persistent cache"),
    "plot": ("tunedb.commands.plot", "plot a database's regions along M"),
    "linalg": ("tunedb.families.linalg.cli", "small batched linear algebra: recommend, plot, tune, repick"),
    "cutoff": ("tunedb.commands.cutoff", "solver choice by measurement: probe, fit, show a cutoff"),
}


def _available() -> dict[str, tuple[str, str]]:
    out = {}
    for name, (module, help_) in COMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            out[name] = (module, help_)
    return out


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tunedb", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        if only is None or only == name:
            importlib.import_module(module).configure(p)
    return parser


def _unrecognized(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str],
                  argv: list[str]) -> None:
    """Exit 2 through the deepest (sub)command parser whose words come before the unknown ones,
    naming those and the nearest flag it knows (`--max-lenght` -> `--max-length`); a flag of a
    subcommand given before the subcommand's name is said to belong after it."""
    import difflib

    chain, pos = [(parser, "")], 0
    while True:
        subs = [a for a in chain[-1][0]._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen is None or chosen not in subs[0].choices or chosen not in argv[pos:]:
            break
        pos = argv.index(chosen, pos) + 1
        chain.append((subs[0].choices[chosen], chosen))
    end = argv.index("--") if "--" in argv else len(argv)
    first = min((argv.index(w) for w in extra if w in argv), default=len(argv))
    # the parser to blame: the deepest whose name comes before the first unknown word
    depth = max(i for i, (_p, name) in enumerate(chain) if i == 0 or argv.index(name) < first)
    blamed = chain[depth][0]
    flags = [o for a in blamed._actions for o in a.option_strings]
    hints = []
    for word in extra:
        if not word.startswith("--") or (word in argv and argv.index(word) > end):
            continue
        name = word.split("=", 1)[0]
        later = [n for p_, n in chain[depth + 1:] if name in (o for a in p_._actions for o in a.option_strings)]
        near = difflib.get_close_matches(name, flags, n=1)
        if later:
            hints.append(f"{name} is an option of `{later[0]}`: put it after that word")
        elif near:
            hints.append(f"{word}: did you mean {near[0]}?")
    blamed.error(f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else ""))


def main(argv: list[str] | None = None) -> int:
    if sys.stdout is None:  # started with stdout closed (`>&-`): what a command prints is discarded
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the process's stdout from here on
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only=chosen)
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse names them with the top-level usage: the command's own, and a near flag
        _unrecognized(parser, args, extra, argv)
    if not args.command:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_database_warnings(warnings.showwarning)
        return _run(module, args)


def _one_line_database_warnings(show: Any) -> Any:
    """warnings.showwarning for a command: a DatabaseWarning is already worded as tunedb's own
    line ('tunedb: skipping ...'), so it prints as that line alone, without Python's file:line
    prefix and source line; any other warning tunedb's own code raises prints as 'tunedb
    warning: ...' on one line (its source line means nothing to a command's user); a library's
    warnings print as `show` prints them."""
    import os

    own = os.path.dirname(os.path.abspath(__file__)) + os.sep

    def showwarning(message: Any, category: type, filename: str, lineno: int, file: Any = None,
                    line: str | None = None) -> None:
        ours = issubclass(category, TunedbWarning) or os.path.abspath(filename or "").startswith(own)
        if not ours:
            return show(message, category, filename, lineno, file, line)
        text = str(message) if issubclass(category, DatabaseWarning) else f"tunedb warning: {message}"
        try:
            print(text, file=sys.stderr if file is None else file)
        except OSError:  # stderr gone: a warning is not worth a second error
            pass
    return showwarning


def _run(module: Any, args: argparse.Namespace) -> int:
    try:
        if args.command != "status":  # status shows invalid settings instead of refusing them
            from tunedb import settings

            settings.check_all()
        rc = int(module.run(args) or 0)
        sys.stdout.flush()  # a closed pipe surfaces here, inside the handler
        return rc
    except BrokenPipeError:
        return _reader_gone()
    except SystemExit as exc:
        # rich's Console meets the closed pipe first: its on_broken_pipe points stdout at devnull
        # and exits 1 from inside the BrokenPipeError's handler; the status is ours to give
        if exc.code == 1 and isinstance(exc.__context__, BrokenPipeError):
            return _reader_gone()
        raise
    except TunedbError as exc:
        print(f"tunedb {args.command}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tunedb {args.command}: error: {os_error_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tunedb {args.command}: interrupted", file=sys.stderr)
        return 130


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def os_error_message(exc: OSError) -> str:
    """One line for a file-system error: the path, what the OS said, and what to do."""
    path = exc.filename if exc.filename is not None else ""
    what = exc.strerror or str(exc)
    text = f"{path}: {what}" if path else what
    if exc.filename2 is not None:
        text = f"{path} -> {exc.filename2}: {what}"
    if isinstance(exc, PermissionError) or getattr(exc, "errno", None) == 30:  # EROFS
        text += ("; choose a writable place: another path for this command's output file or directory, or "
                 "TUNEDB_USER_DB=DIR for the user tier and TUNEDB_CACHE_DIR=DIR for caches")
    return text


def _reader_gone() -> int:
    """The reader of stdout closed the pipe: stop quietly (Python's documented way: point stdout
    at devnull so the interpreter's final flush does not raise again)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file: nothing left to flush into
        pass
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
