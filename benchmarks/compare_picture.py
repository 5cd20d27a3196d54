"""The README's comparison picture from a `fabriclab compare` run (no root).

    .venv/bin/python benchmarks/compare_picture.py [results/compare/compare.json] [--out docs/compare.png]

Reads `compare.json` (what `fabriclab compare` wrote) and draws its rows with `fabriclab.render.compare_png`,
the picture `fabriclab compare` writes as compare.png: step time and scaling efficiency against GPUs per
series, each row's step split into compute / exposed communication by group / idle, and the hottest link by
tier. Draw it from a real run only: the picture shows what the simulator found.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fabriclab.rows import Row  # noqa: E402
from fabriclab.render import compare_png  # noqa: E402

DEFAULT_JSON = Path("results/compare/compare.json")
DEFAULT_OUT = Path("docs/compare.png")


def rows_of(doc: dict[str, object]) -> list[Row]:
    """compare.json's rows as `Row`s (fields a newer or older file has and `Row` has not are left out)."""
    names = {f.name for f in dataclasses.fields(Row)}
    rows = doc.get("rows", [])
    assert isinstance(rows, list)
    return [Row(**{k: v for k, v in r.items() if k in names}) for r in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("compare_json", type=Path, nargs="?", default=DEFAULT_JSON)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the PNG to write (default {DEFAULT_OUT})")
    ap.add_argument("--title", help="the picture's title (default: fabriclab compare: the run's trace)")
    args = ap.parse_args(argv)
    doc = json.loads(args.compare_json.read_text())
    rows = rows_of(doc)
    if not rows:
        ap.error(f"{args.compare_json}: no rows to draw")
    title = args.title or f"fabriclab compare: {doc.get('meta', {}).get('trace', args.compare_json)}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_bytes(compare_png(rows, title))
    tmp.replace(args.out)
    print(f"wrote {args.out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
