"""Command line: ``python -m polyop <command>``.

Commands are small functions registered in ``COMMANDS``; add one by writing
``def cmd_<name>(args)`` plus a ``_setup_<name>(parser)`` and listing it there.
"""

from __future__ import annotations

import argparse
import json
import sys


def _setup_ops(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help="a built polyop library (default: the stock ops)")
    p.add_argument("--all", action="store_true", help="include backward-only ops")
    p.add_argument("--json", action="store_true", help="print the metadata as JSON")


def cmd_ops(args: argparse.Namespace) -> int:
    import polyop

    from ._library import op_notes

    meta = polyop if args.path is None else polyop.load(args.path)
    infos = [o for o in meta.ops() if args.all or not o["flags"]["backward_only"]]
    if args.json:
        print(json.dumps(infos, indent=2))
        return 0
    width = max((len(o["name"]) for o in infos), default=0)
    for o in infos:
        notes = op_notes(o["flags"], (o["backward"] or {}).get("op"))
        dts = ",".join(o["dtypes"])
        extra = f"  [{'; '.join(notes)}]" if notes else ""
        print(f"{o['name']:<{width}}  {o['schema']}  dtypes={dts}{extra}")
    return 0


def _setup_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="op name")


def cmd_info(args: argparse.Namespace) -> int:
    import polyop

    print(json.dumps(polyop.op_info(args.name), indent=2))
    return 0


def _setup_libs(p: argparse.ArgumentParser) -> None:
    pass


def cmd_libs(args: argparse.Namespace) -> int:
    import polyop

    status = 0
    for fw in ("torch", "tensorflow", "onnxruntime", "xla"):
        try:
            print(f"{fw:<12} {polyop.library_path(fw)}")
        except FileNotFoundError as e:
            print(f"{fw:<12} missing: {e}")
            status = 1
    return status


def _setup_check(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="a built polyop library (.so)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per library")


def cmd_check(args: argparse.Namespace) -> int:
    """Framework, ops and schemas of a built library; does it load here; smoke call of each op
    (in a subprocess, so a crash is diagnosed)."""
    from ._check import check

    status = 0
    for i, path in enumerate(args.paths):
        if i:
            print()
        code, text = check(path, timeout=args.timeout)
        print(text, flush=True)
        status = max(status, code)
    return status


def _setup_build(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="an op crate or workspace (its Cargo.toml)")
    p.add_argument("--out", default="dist", help="directory for the wheel (default: dist)")
    p.add_argument("-v", "--verbose", action="store_true", help="show cargo's output")


def cmd_build(args: argparse.Namespace) -> int:
    """Build an op crate's framework libraries (cached by content hash) and package them as a
    wheel whose ``<namespace>.load()`` opens them."""
    from ._build import build_wheel

    try:
        whl = build_wheel(args.path, args.out, verbose=args.verbose)
    except (RuntimeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(whl)
    return 0


#: name -> (help, setup(parser), run(args) -> exit code)
COMMANDS = {
    "ops": ("list the registered ops and their schemas", _setup_ops, cmd_ops),
    "info": ("print one op's metadata as JSON", _setup_info, cmd_info),
    "libs": ("show where the framework libraries are", _setup_libs, cmd_libs),
    "check": ("check a built polyop library: framework, ops, loads here, smoke call of each op",
              _setup_check, cmd_check),
    "build": ("build an op crate and package its libraries as a wheel", _setup_build, cmd_build),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polyop", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_, setup, _) in COMMANDS.items():
        setup(sub.add_parser(name, help=help_))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][2](args)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
