"""`ga-companion`, the companion's one command: each subcommand is a module's own command line.

    ga-companion book build [--profile paper] [--smoke]     # = python -m helpers.book build ...
    ga-companion lmeval --model M --tasks T --zero L16H22   # = python -m helpers.lmeval ...
    ga-companion cache [--delete stale]                     # = python -m helpers.cache ...
    ga-companion kernels                                    # = python -m helpers.kernels
    ga-companion zoo build [NAME ...]                       # = python -m helpers.zoo build ...
    ga-companion minihub DIR                                # = python -m helpers.minihub DIR

The subcommand's module is imported only once it is named, so `ga-companion`, `--help` and a
mistyped subcommand answer without loading torch.
"""

from __future__ import annotations

import difflib
import importlib
import sys

COMMANDS = {
    "book": "build the book (execute the chapters, render, check the pages), sync the notebooks",
    "lmeval": "any lm-eval task on a model of the book, under an intervention",
    "cache": "what the model cache holds; delete from it",
    "kernels": "the prebuilt mamba-ssm / causal-conv1d wheels for this torch, CUDA and Python",
    "zoo": "retrain the toy zoo",
    "minihub": "write the rehearsal's mini-hub of random-weight paper models",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    return (
        "usage: ga-companion COMMAND [ARGS ...]  (ga-companion COMMAND --help)\n\ncommands:\n"
        + "".join(f"  {name:<{width}}  {summary}\n" for name, summary in COMMANDS.items())
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0
    name, *rest = argv
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        print(
            usage()
            + f"\nga-companion: error: no command {name!r}{f' (did you mean {close[0]}?)' if close else ''}",
            file=sys.stderr,
        )
        return 2
    return importlib.import_module(f"helpers.{name}").main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
