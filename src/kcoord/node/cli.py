"""The ``kcoord`` command line.

Subcommands:
  dump-log FILE... [--print-data-log] [--offsets-decoder]   like kafka-dump-log.sh
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kcoord import __version__


def _dump_log(args: argparse.Namespace) -> int:
    from kcoord.node.dump_log import dump_files

    return dump_files(
        [Path(f) for f in args.files],
        sys.stdout,
        print_data=args.print_data_log,
        offsets_decoder=args.offsets_decoder,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kcoord", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kcoord {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    dump = sub.add_parser("dump-log", help="print log segments, offset and time indexes")
    dump.add_argument("files", nargs="+", metavar="FILE", help=".log, .index or .timeindex")
    dump.add_argument("--print-data-log", action="store_true", help="print every record")
    dump.add_argument(
        "--offsets-decoder",
        action="store_true",
        help="decode __consumer_offsets records (implies --print-data-log)",
    )
    dump.set_defaults(func=_dump_log)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
