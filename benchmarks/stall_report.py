"""Where a thread of a sampled `gearshift serve` process spent its long stretches (`stack_sampler`'s dump).

A stretch is a run of consecutive samples (10 ms apart) whose innermost frames are the same; the report lists
each over `--min-ms` on the thread `--thread` (the engine's: "gearshift-engine"), with its start (seconds
after the thread's first sample) and its stack, innermost first. Stop 58: a 1.16 s stretch at
transformer.py's scaled_dot_product_attention, inside a prefill, was the serve stall.

Usage: python benchmarks/stall_report.py STACKS.json.gz [--thread gearshift-engine] [--min-ms 80] [--frames 3] [--idle]
"""
from __future__ import annotations

import argparse
import gzip
import json


def stretches(samples: list, stacks: list, thread: str, frames: int, gap_s: float = 0.25) -> list[dict]:
    """[{start, seconds, stack}] of runs of samples of `thread` whose innermost `frames` frames agree, with no
    gap over `gap_s` (the sampler stops for up to ~0.2 s while it writes its dump)."""
    runs: list[dict] = []
    for t, name, sid in samples:
        if name != thread:
            continue
        key = tuple(stacks[sid][:frames])
        cur = runs[-1] if runs else None
        if cur is not None and cur["key"] == key and t - cur["end"] < gap_s:
            cur["end"] = t
        else:
            runs.append({"key": key, "start": t, "end": t, "stack": stacks[sid]})
    return [{"start": r["start"], "seconds": r["end"] - r["start"], "stack": r["stack"]} for r in runs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dump", help="stacks_<pid>.json.gz from stack_sampler")
    ap.add_argument("--thread", default="gearshift-engine", help="thread name (default %(default)s)")
    ap.add_argument("--min-ms", type=float, default=80, help="shortest stretch listed (default %(default)s)")
    ap.add_argument("--frames", type=int, default=3, help="innermost frames that must agree (default %(default)s)")
    ap.add_argument("--idle", action="store_true", help="list waits for work too (innermost frame in threading.py)")
    a = ap.parse_args()
    with gzip.open(a.dump, "rt") as f:
        d = json.load(f)
    mine = [s for s in d["samples"] if s[1] == a.thread]
    if not mine:
        names = sorted({s[1] for s in d["samples"]})
        raise SystemExit(f"no samples of thread {a.thread!r}; threads sampled: {', '.join(names)}")
    t0 = mine[0][0]
    long = [r for r in stretches(d["samples"], d["stacks"], a.thread, a.frames) if r["seconds"] * 1e3 >= a.min_ms
            and (a.idle or not r["stack"][0].startswith("threading.py"))]
    print(f"{len(mine)} samples of {a.thread} over {mine[-1][0] - t0:.1f} s; {len(long)} stretches of "
          f"{a.min_ms:.0f} ms or more")
    for r in sorted(long, key=lambda r: -r["seconds"]):
        print(f"\n+{r['start'] - t0:8.3f} s  {r['seconds'] * 1e3:7.0f} ms")
        for fr in r["stack"][:12]:
            print(f"    {fr}")


if __name__ == "__main__":
    main()
