"""Print (batch, packed µs, fp16 µs) of every decode-step JSON in a folder whose name matches a glob:
``python3 docs/bench/decode_summary.py OUT 'decode_*_pdl*.json'`` (used by pdl_ab.sh and fuse_ab.sh)."""

import json
import pathlib
import sys

folder, pattern = pathlib.Path(sys.argv[1]), sys.argv[2]
for f in sorted(folder.glob(pattern)):
    try:
        rows = json.loads(f.read_text())
        print(f.name, [(r["batch"], round(r["packed_us"], 1), round(r["fp16_us"], 1)) for r in rows])
    except Exception as e:  # noqa: BLE001 — a failed run leaves an empty or partial file; say so and go on
        print(f.name, "unreadable:", e)
