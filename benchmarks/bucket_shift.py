"""A what-if policy map whose picks at one M bucket are another bucket's (stop 71), for `policy_ab.py --b`.

Why: a token count between two buckets runs the larger bucket's pick (`PolicyMap.lookup`). Whether the smaller
bucket's pick would serve it better is a whole-step A/B against such a map:

    python benchmarks/bucket_shift.py --map gearshift/data/policy/NVIDIA_H200.json --take 16 --into 32 --out b.json
    python benchmarks/policy_ab.py --a gearshift/data/policy/NVIDIA_H200.json --b b.json --mode w4a16 --m 17,24,32

The map is loaded as the engine loads it (on its own GPU, filled from its architecture's maps), so run this on
the GPU the A/B runs on. Its timings are dropped (they would describe the other picks).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gearshift.dispatch.policy import load_map_file  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", required=True, help="policy map JSON")
    ap.add_argument("--take", type=int, required=True, help="the bucket whose picks are copied")
    ap.add_argument("--into", type=int, required=True, help="the bucket that gets them")
    ap.add_argument("--modes", default="w4a16,w4a8", help="modes whose entries change (comma-separated)")
    ap.add_argument("--out", required=True, help="where to write the what-if map")
    a = ap.parse_args()
    pm = load_map_file(a.map)
    if a.take not in pm.buckets or a.into not in pm.buckets:
        raise SystemExit(f"--take and --into must be buckets of the map: {list(pm.buckets)}")
    i, j = pm.buckets.index(a.take), pm.buckets.index(a.into)
    modes, n = set(a.modes.split(",")), 0
    for key, row in pm.entries.items():
        if key.split(":")[0] in modes and row[i] is not None:
            row[j] = row[i]
            n += 1
    pm.timings = {}
    pm.save(a.out)
    print(f"{a.out}: bucket {a.into} runs bucket {a.take}'s picks in {n} entries")


if __name__ == "__main__":
    main()
