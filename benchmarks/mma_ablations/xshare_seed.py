"""Profile only the xshare tiles against a map's best fragment tiles, and take them where they win (stop 41).

`gearshift profile --seed MAP` times the seed's fastest candidates at each point and every tile the
seed never timed there. The shipped map's W4A8 / W4A4 points hold timings of only some fragment
tiles, so a seeded run would sweep all the others too. `seed` writes a copy of the map in which
every fragment tile of the strategy (`--strategy`) that is not an xshare tile counts as timed
(without a time) at the given modes and M buckets: a profile seeded with it times the map's `--top`
fastest there plus the xshare tiles. `take` then puts into the map the points of such a profile
whose fastest candidate is an xshare tile (the map's own picks were timed in the same run), and
nothing else.

    python benchmarks/mma_ablations/xshare_seed.py seed --map gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json \
        --strategy w4a8_mma_int8 --modes w4a8,w4a4 --m 8,16 --out seed.json
    python -m gearshift profile --model llama3-8b --m 8,16 --modes w4a8,w4a4 --strategies w4a8_mma_int8 \
        --int4-prog --seed seed.json --top 3 --replace --out prof.json
    python benchmarks/mma_ablations/xshare_seed.py take --map gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json \
        --profile prof.json --note "..." --out merged.json
"""
from __future__ import annotations

import argparse
import json

from gearshift.dispatch.policy import candidate_name, parse_candidate
from gearshift.dispatch.profiler import random_store
from gearshift.dispatch.strategies import STRATEGIES
from gearshift.quant.modes import MODES


def seed(a) -> None:
    d = json.load(open(a.map))
    strat = STRATEGIES[a.strategy]
    modes = a.modes.split(",")
    added = 0
    for key, points in d["timings"].items():
        mode, n, k = key.split(":")[0], *map(int, key.split(":")[2].split("x"))
        if mode not in modes:
            continue
        store = random_store("int4", n, k, 128, "cpu", layout="blocks16")
        act = MODES[mode].act
        for m in a.m.split(","):
            point = points.get(m)
            if point is None:
                continue
            for cfg in strat.configs(int(m)):
                name = candidate_name(strat.name, cfg)
                if not cfg.xshare and name not in point and strat.supports(store, act, cfg):
                    point[name] = None
                    added += 1
    json.dump(d, open(a.out, "w"), indent=1)
    print(f"{a.out}: {added} fragment tiles marked as timed")


def is_xshare(candidate: str) -> bool:
    cfg = parse_candidate(candidate)[1]
    return cfg is not None and cfg.xshare


def take(a) -> None:
    d = json.load(open(a.map))
    prof = json.load(open(a.profile))
    taken = []
    for key, points in prof["timings"].items():
        for m, cands in points.items():
            ok = {c: us for c, us in cands.items() if us is not None}
            if not ok:
                continue
            best = min(ok, key=ok.get)
            if not is_xshare(best):
                continue
            name, cfg = parse_candidate(best)
            d["entries"][key][m] = {"strategy": name, "config": cfg.to_dict(), "us": ok[best]}
            d["timings"].setdefault(key, {}).setdefault(m, {}).update(
                {c: us for c, us in cands.items() if is_xshare(c)})
            taken.append(f"{key} M={m}")
    d["meta"].setdefault("merged", []).append(f"{a.note}: " + ", ".join(taken))
    json.dump(d, open(a.out, "w"), indent=1)
    print(f"{a.out}: took {len(taken)} points: {', '.join(taken)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seed")
    s.add_argument("--map", required=True)
    s.add_argument("--strategy", required=True)
    s.add_argument("--modes", required=True)
    s.add_argument("--m", required=True)
    s.add_argument("--out", required=True)
    t = sub.add_parser("take")
    t.add_argument("--map", required=True)
    t.add_argument("--profile", required=True)
    t.add_argument("--note", required=True)
    t.add_argument("--out", required=True)
    a = ap.parse_args()
    (seed if a.cmd == "seed" else take)(a)


if __name__ == "__main__":
    main()
