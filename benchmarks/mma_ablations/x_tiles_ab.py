"""The fragment kernel on inputs in `to_x_tiles`' layout against natural-order inputs, on the map's best
few-token tiles (GPU; stop 64).

Why: at 16 tokens a warp of the 32-row tiles loads twice its weight bytes of inputs, and each of its
16-byte input loads gathers 16-byte pieces of 8 token rows (16 cache lines, half of every 32-byte sector).
Stop 46's counters put the L1/TEX unit at 79% of its peak on gate_up's 16-token tile with DRAM at 55%.
In `to_x_tiles`' layout every input load of a warp reads 512 contiguous bytes (4 lines, whole sectors).
The inputs are permuted before timing (the engine's producers write the layout since stop 64), so this
measures the kernels alone. W4A16 times two x-tile layouts: "tiles", stop 64's, whose 16-bit chunks hold
their columns in natural order, and "tiles_fragment", the shipped one since stop 65, in fragment order (no
input PRMTs in the block). Per mode, shape and M, in one process:
- the map's pick and its next fastest fragment-kernel tiles (`--top`, from the map's timings), natural
  and x-tile inputs (the same bits, checked on every tile), us per call; x-tile inputs cannot run xshare
  tiles (whose warps share each block's inputs through shared memory), so an xshare tile runs them as the
  same tile without xshare;
- the whole 32-layer step of the four linears (CUDA-graph replay, `kernels.step_fn`): the map's picks
  natural (W4A8: also on fragment-order codes), each shape's best natural tile, and each shape's best tile on each
  other input, `--rounds` times alternating.
W4A8 runs int8 codes through `w4a8_mma_int8`'s tiles (codes made before timing, as the producers hand them),
on four inputs: "natural", "tiles" (natural chunk order), and since stop 69 "fragment" (row order, each 8 codes'
even columns then odd ones: no input PRMTs in the int8 block) and "tiles_fragment" (x tiles of that order).

    PYTHONPATH=. python benchmarks/mma_ablations/x_tiles_ab.py --modes w4a16,w4a8 --m 1,4,8,16 --out $OUT
"""
import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel_bench import Model, step_fn, tag_suffix, time_step, write_json  # noqa: E402  (benchmarks/kernel_bench.py)

from gearshift.kernels.config import TileConfig  # noqa: E402
from gearshift.dispatch.policy import PolicyMap, device_slug, load_map_file  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, copy_bandwidth, n_copies, random_store, time_us  # noqa: E402
from gearshift.kernels import int4_mma_gemv as mg  # noqa: E402

STRATEGY = {"w4a16": "w4a16_mma", "w4a8": "w4a8_mma_int8"}


def candidates(pm: PolicyMap, mode: str, key: str, m: int, top: int) -> list[TileConfig]:
    """The map's pick at (key, m), then its next fastest timed tiles of the mode's fragment strategy."""
    pick = pm.lookup(key, m)
    if pick.strategy != STRATEGY[mode]:
        raise SystemExit(f"{key} at M={m}: the map picks {pick.strategy}, not {STRATEGY[mode]}")
    out = [pick.config]
    timed = pm.timings.get(key, {}).get(str(m), {})
    timed = sorted(((nm, us) for nm, us in timed.items() if us is not None), key=lambda kv: kv[1])
    for name, _ in timed:
        strat, _, cfg = name.partition("@")
        if strat != STRATEGY[mode] or len(out) >= top:
            continue
        c = TileConfig.from_dict(json.loads(cfg))
        if all(c.key() != o.key() for o in out):
            out.append(c)
    return out


def inputs(mode: str, m: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """A linear's inputs: 16-bit activations (W4A16), or int8 codes as the producers hand them (W4A8)."""
    if mode == "w4a16":
        return torch.randn(m, k, device="cuda", dtype=dtype)
    return torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)


def token_scales(mode: str, m: int) -> torch.Tensor | None:
    """The codes' per-token scales (W4A8), or None (W4A16)."""
    return None if mode == "w4a16" else torch.rand(m, device="cuda") + 0.5


VARIANTS = {"w4a16": ("natural", "tiles", "tiles_fragment"),
            "w4a8": ("natural", "tiles", "fragment", "tiles_fragment")}


def prepared(variant: str, m: int):
    """(how a variant lays out a linear's inputs, the `mma_gemv` arguments that say so)."""
    if variant == "natural":
        return (lambda x: x), {}
    if variant == "fragment":
        return mg.to_fragment_order, {"fragment_order": True}
    fo = variant == "tiles_fragment"
    return (lambda x: mg.to_x_tiles(x, fragment_order=fo)), {"x_tiles": m, "fragment_order": fo}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    ap.add_argument("--modes", default="w4a16,w4a8")
    ap.add_argument("--m", default="1,4,8,16")
    ap.add_argument("--top", type=int, default=4, help="fragment-kernel tiles per point: the pick and the next fastest")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("x_tiles_ab.py needs a CUDA GPU")
    pm = load_map_file(a.map)
    shapes = PRESETS["llama3-8b"]["shapes"]
    bw = copy_bandwidth()
    dtype = torch.bfloat16
    res = {"device": torch.cuda.get_device_name(), "map": a.map, "top": a.top, "copy_bw_Bps": bw,
           "shapes": {}, "step_ms": {}}
    name_out = f"x_tiles_ab_{device_slug(res['device'])}{tag_suffix(a.tag)}.json"
    model = Model("int4", shapes, PRESETS["llama3-8b"]["layers"], 128, dtype, "blocks16")
    res["floor_ms"] = model.nbytes() / bw * 1000
    t0 = time.time()
    for mode in a.modes.split(","):
        # W4A16: "tiles" is stop 64's layout (16-bit chunks in natural order), "tiles_fragment" the shipped one
        variants = VARIANTS[mode]
        for m in (int(v) for v in a.m.split(",")):
            best = {v: {} for v in variants}  # shape -> (us, cfg)
            picks = {}
            for name, n, k in shapes:
                key = f"{mode}:g128:{n}x{k}"
                stores = [random_store("int4", n, k, 128, "cuda", dtype, "blocks16")]
                stores += [random_store("int4", n, k, 128, "cuda", dtype, "blocks16")
                           for _ in range(n_copies(stores[0]) - 1)]
                x, ts = inputs(mode, m, k, dtype), token_scales(mode, m)
                od = dtype if ts is not None else None
                xin = {}
                for v in variants:
                    prep, kw = prepared(v, m)
                    xin[v] = (prep(x), kw)
                cands = candidates(pm, mode, key, m, a.top)
                picks[name] = cands[0]
                rows = []
                for c in cands:
                    y = mg.mma_gemv(x, stores[0], c, ts, od)
                    row = {"tile": c.key()}
                    for v, (xv, kw) in xin.items():
                        cv = dataclasses.replace(c, xshare=False) if v.startswith("tiles") else c
                        if v != "natural" and not torch.equal(mg.mma_gemv(xv, stores[0], cv, ts, od, **kw), y):
                            raise SystemExit(f"{mode} {name} M={m} {cv.key()}: {v} inputs give other bits")
                        us = time_us([lambda s=s, xv=xv, kw=kw, cv=cv: mg.mma_gemv(xv, s, cv, ts, od, **kw)
                                      for s in stores])
                        row[v] = us
                        if name not in best[v] or us < best[v][name][0]:
                            best[v][name] = (us, cv)
                    rows.append(row)
                    print(f"{mode} {name:8s} M={m:2d} {c.key():40s} " + "  ".join(
                        f"{v} {row[v]:7.2f}" for v in variants), flush=True)
                res["shapes"][f"{mode}|{name}|{m}"] = rows
            xs = [inputs(mode, m, k, dtype) for _, _, k in shapes]
            ts = token_scales(mode, m)
            od = None if ts is None else dtype

            def run_for(cfgs, prep, kw):
                xv = [prep(x) for x in xs]
                ids = {id(t): i for i, t in enumerate(xv)}
                return step_fn(model, xv, lambda t, s: mg.mma_gemv(t, s, cfgs[ids[id(t)]], ts, od, **kw))

            runs = {"map_natural": run_for([picks[nm] for nm, _, _ in shapes], lambda x: x, {})}
            if "fragment" in variants:  # the map's own picks on fragment-order codes: what the engine runs
                runs["map_fragment"] = run_for([picks[nm] for nm, _, _ in shapes], *prepared("fragment", m))
            for v in variants:
                runs[f"best_{v}"] = run_for([best[v][nm][1] for nm, _, _ in shapes], *prepared(v, m))
            times = {r: [] for r in runs}
            for _ in range(a.rounds):
                for r, run in runs.items():
                    times[r].append(time_step(run))
            med = {r: statistics.median(v) for r, v in times.items()}
            res["step_ms"][f"{mode}|{m}"] = {"runs": times, **med, **{
                f"best_{v}_cfg": {nm: c.key() for nm, (_, c) in best[v].items()} for v in variants}}
            print(f"{mode} M={m:2d} step ms: " + "  ".join(f"{r} {v:.3f}" for r, v in med.items())
                  + "".join(f"  {v}/natural {med[f'best_{v}'] / med['best_natural']:.3f}" for v in variants[1:])
                  + f"  ({time.time() - t0:.0f} s)", flush=True)
            write_json(a.out, name_out, res)
    print(f"wrote {Path(a.out) / name_out}")


if __name__ == "__main__":
    main()
