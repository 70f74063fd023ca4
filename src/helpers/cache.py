"""What the model cache holds, and deleting from it.

    python -m helpers.cache                  # each GGUF and dequantized copy, its dtype and size
    python -m helpers.cache --delete stale   # copies the current code would not use
    python -m helpers.cache --delete qwen2.5-coder-1.5b-instruct   # one model's files (or: all)

The cache is `GA_CACHE` (default ~/.cache/ga-companion): the CPU models' GGUF files joined from
their PyPI parts, and a dequantized copy per dtype each was loaded in (`models.keep_dequantized`).
"""

from __future__ import annotations

import argparse
import shutil

from . import paths


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m helpers.cache", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--delete",
        metavar="WHAT",
        default=None,
        help="delete one model's files (its name, as listed), the copies the current code would not "
        "use (stale), or everything (all)",
    )
    args = p.parse_args(argv)
    from .models import cached  # torch: only once the arguments are good

    rows = cached()
    print(f"{paths.cache_dir()} (GA_CACHE){':' if rows else ' holds nothing'}")
    for r in rows:
        print(
            f"  {r['bytes'] / 2**30:6.2f} GB  {r['kind']:<22} {'' if r['current'] else '(stale) '}{r['path'].name}"
        )
    if args.delete:
        doomed = [
            r
            for r in rows
            if args.delete in ("all", r["model"]) or (args.delete == "stale" and not r["current"])
        ]
        if not doomed and args.delete not in ("all", "stale"):
            raise SystemExit(
                f"nothing cached for {args.delete!r}: give a model's name as listed, stale or all"
            )
        for r in doomed:
            shutil.rmtree(r["path"]) if r["path"].is_dir() else r["path"].unlink()
            print(f"deleted {r['path'].name} ({r['bytes'] / 2**30:.2f} GB)")


if __name__ == "__main__":
    main()
