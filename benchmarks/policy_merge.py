"""Merge the entries (and candidate timings) of a freshly profiled policy map into another (e.g. the
shipped one) for the given modes and M buckets, keeping everything else; appends what was merged
to the map's meta.merged list.

    python benchmarks/policy_merge.py --base gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json \\
        --new $OUT/policy_NVIDIA_H100_80GB_HBM3.json --modes w4a16 --m 2,4,8,16 --out merged.json
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gearshift.dispatch.profiler import mark_regime, point_id  # noqa: E402
from gearshift.jsonfile import read_json  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--modes", required=True, help="comma-separated mode prefixes of the entry keys, e.g. w4a16")
    ap.add_argument("--m", required=True, help="comma-separated M buckets to take from --new")
    ap.add_argument("--note", default="", help="recorded in meta.merged")
    ap.add_argument("--out", required=True)
    ap.add_argument("--foreign", action="store_true",
                    help="take --new although another GPU profiled it: a what-if map for A/Bs on that GPU (e.g. an "
                    "H200 borrowing the H100's map), never one to ship; meta.merged records the other device")
    a = ap.parse_args()
    base, new = read_json(a.base), read_json(a.new)
    if base["device"] != new["device"] and not a.foreign:
        raise SystemExit(f"device mismatch: {base['device']} vs {new['device']} (--foreign for a what-if map)")
    modes, ms = a.modes.split(","), a.m.split(",")
    taken = 0
    for key, per_m in new["entries"].items():
        if key.split(":")[0] not in modes:
            continue
        for m in ms:
            if m in per_m:
                base["entries"].setdefault(key, {})[m] = per_m[m]
                taken += 1
            # the candidates timed there join the base's (newer times win): what static strategies
            # and AdaptiveDispatcher._best_served read
            timed = new.get("timings", {}).get(key, {}).get(m)
            if timed:
                point = base.setdefault("timings", {}).setdefault(key, {}).setdefault(m, {})
                # burst and sustained timings (profiler.SUSTAIN_FROM_M) do not compare: the base's go
                # where the new map timed the point the other way
                pid = point_id(key, int(m))
                mark_regime(base.setdefault("meta", {}), pid, point,
                            pid in new.get("meta", {}).get("sustained_points", []))
                if a.foreign:  # timings of two GPUs do not compare: the point's are the new GPU's alone
                    point.clear()
                point.update(timed)
    meta = base.setdefault("meta", {})
    history = meta.get("merged", [])
    history = [history] if isinstance(history, str) else list(history)  # earlier maps kept one string
    source = f" (profiled on {new['device']})" if base["device"] != new["device"] else ""
    meta["merged"] = history + [f"{a.modes} M={a.m} from {a.new}{source}" + (f": {a.note}" if a.note else "")]
    Path(a.out).write_text(json.dumps(base, indent=1))
    print(f"merged {taken} entries into {a.out}")


if __name__ == "__main__":
    main()
