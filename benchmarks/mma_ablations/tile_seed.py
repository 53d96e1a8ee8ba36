"""Profile tiles with one flag (TileConfig.xshare or .ksum) against a map's best fragment tiles, and take
them where they win (stops 41, 42).

`gearshift profile --seed MAP --top N --new-tiles` times the seed's N fastest candidates at each point
and every tile the seed never timed there. A new flag adds many tiles the shipped map never timed (and
the shipped maps keep only some timings per point), so such a run would sweep most of them. `seed` writes a copy of the map in which every fragment tile of the
strategy (`--strategy`) counts as timed (without a time) at the given modes and M buckets, except the
`--flag` twins of the point's `--top` fastest tiles and of the map's own pick (or, with `--all`, every
flagged tile: stop 41's xshare seed). A profile seeded with it (same `--top`) times the map's fastest
there plus those twins. `take` then puts into the map the points of such a profile whose fastest
candidate has the flag (the map's own picks were timed in the same run), and nothing else. `twins`
writes the map with every pick at the given modes and M replaced by its flag twin where the tile can
take the flag (untimed: for a whole-step A/B of the flag everywhere, `policy_ab.py`).

    python benchmarks/mma_ablations/tile_seed.py seed --flag ksum --map gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json \\
        --strategy w4a16_mma --modes w4a16 --m 1,2 --top 6 --out seed.json
    python -m gearshift profile --model llama3-8b --m 1,2 --modes w4a16 --strategies w4a16_mma \\
        --seed seed.json --top 6 --new-tiles --replace --out prof.json
    python benchmarks/mma_ablations/tile_seed.py take --flag ksum --map gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json \\
        --profile prof.json --note "..." --out merged.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json

from gearshift.dispatch.policy import candidate_name, parse_candidate
from gearshift.dispatch.profiler import random_store
from gearshift.dispatch.strategies import STRATEGIES
from gearshift.kernels.config import TileConfig
from gearshift.kernels.int4_mma_gemv import ksum_fits, xshare_fits
from gearshift.quant.modes import MODES
from gearshift.jsonfile import read_json


FITS = {"xshare": xshare_fits, "ksum": ksum_fits}  # (shared memory: per token count, not in Strategy.supports)


def has_flag(candidate: str, flag: str) -> bool:
    cfg = parse_candidate(candidate)[1]
    return cfg is not None and getattr(cfg, flag)


def twin(cfg, flag: str):
    return dataclasses.replace(cfg, **{flag: True})


def store_for(key: str):
    n, k = map(int, key.split(":")[2].split("x"))
    return random_store("int4", n, k, 128, "cpu", layout="blocks16")


def seed(a) -> None:
    d = read_json(a.map)
    strat = STRATEGIES[a.strategy]
    modes = a.modes.split(",")
    marked = 0
    left = 0
    for key, points in d["timings"].items():
        mode = key.split(":")[0]
        if mode not in modes:
            continue
        store, act = store_for(key), MODES[mode].act
        for m in a.m.split(","):
            point = points.get(m)
            if point is None:
                continue
            ranked = sorted((us, c) for c, us in point.items() if us is not None)
            best = {c for _, c in ranked[:a.top]}
            pick = d["entries"].get(key, {}).get(m, {})
            if pick.get("config") and pick.get("strategy") == strat.name:
                best.add(candidate_name(strat.name, TileConfig.from_dict(pick["config"])))
            wanted = {candidate_name(strat.name, twin(parse_candidate(c)[1], a.flag)) for c in best
                      if parse_candidate(c)[0] == strat.name and not has_flag(c, a.flag)}
            for cfg in strat.configs(int(m)):
                name = candidate_name(strat.name, cfg)
                if name in point or not strat.supports(store, act, cfg):
                    continue
                if getattr(cfg, a.flag) and (a.all or name in wanted):
                    left += 1
                    continue
                point[name] = None
                marked += 1
    json.dump(d, open(a.out, "w"), indent=1)
    print(f"{a.out}: {marked} fragment tiles marked as timed, {left} {a.flag} tiles left to time")


def take(a) -> None:
    d = read_json(a.map)
    prof = read_json(a.profile)
    taken = []
    for key, points in prof["timings"].items():
        for m, cands in points.items():
            ok = {c: us for c, us in cands.items() if us is not None}
            if not ok or (a.m and m not in a.m.split(",")):
                continue
            best = min(ok, key=ok.get)
            if not has_flag(best, a.flag):
                continue
            name, cfg = parse_candidate(best)
            d["entries"][key][m] = {"strategy": name, "config": cfg.to_dict(), "us": ok[best]}
            d["timings"].setdefault(key, {}).setdefault(m, {}).update(
                {c: us for c, us in cands.items() if has_flag(c, a.flag)})
            taken.append(f"{key} M={m}")
    d["meta"].setdefault("merged", []).append(f"{a.note}: " + ", ".join(taken))
    json.dump(d, open(a.out, "w"), indent=1)
    print(f"{a.out}: took {len(taken)} points: {', '.join(taken)}")


def twins(a) -> None:
    d = read_json(a.map)
    strat = STRATEGIES[a.strategy]
    modes = a.modes.split(",")
    changed = []
    for key, points in d["entries"].items():
        mode = key.split(":")[0]
        if mode not in modes:
            continue
        store, act = store_for(key), MODES[mode].act
        for m, e in points.items():
            if m not in a.m.split(",") or e.get("strategy") != strat.name or not e.get("config"):
                continue
            cfg = twin(TileConfig.from_dict(e["config"]), a.flag)
            if strat.supports(store, act, cfg) and FITS[a.flag](cfg, int(m)):
                points[m] = {"strategy": strat.name, "config": cfg.to_dict(), "us": e.get("us")}
                changed.append(f"{key} M={m}")
    d["meta"].setdefault("merged", []).append(f"{a.note}: " + ", ".join(changed))
    json.dump(d, open(a.out, "w"), indent=1)
    print(f"{a.out}: {len(changed)} picks with {a.flag}: {', '.join(changed)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seed", help="a seed map whose profile times only the flag twins of the best tiles")
    s.add_argument("--top", type=int, default=3, help="the twins of this many fastest tiles per point")
    s.add_argument("--all", action="store_true", help="leave every flagged tile untimed (stop 41's xshare seed)")
    w = sub.add_parser("twins", help="the map with every pick replaced by its flag twin where it can take it")
    w.add_argument("--note", required=True)
    for p in (s, w):
        p.add_argument("--strategy", required=True)
        p.add_argument("--modes", required=True)
        p.add_argument("--m", required=True)
    t = sub.add_parser("take", help="merge the profile's points whose fastest candidate has the flag")
    t.add_argument("--profile", required=True)
    t.add_argument("--note", required=True)
    t.add_argument("--m", default="", help="only these M buckets (default: every one the profile timed)")
    for p in (s, w, t):
        p.add_argument("--flag", required=True, choices=("xshare", "ksum"))
        p.add_argument("--map", required=True)
        p.add_argument("--out", required=True)
    a = ap.parse_args()
    {"seed": seed, "take": take, "twins": twins}[a.cmd](a)


if __name__ == "__main__":
    main()
