"""Registers and CTAs per SM of the small-M fragment tiles a policy map launches (CPU, no GPU needed).

Compiles `int4_mma_gemv._mma_gemv_kernel` for sm_90 with each (mode, shape, M) entry's tile as the
engine launches it (blocks16 stores, PDL, the shipped trigger rule; bf16 activations for W4A16,
int8 codes for W4A8 / W4A4), runs Triton's ptxas with -v, and reports registers per thread, spills,
shared memory and how many CTAs (and warps) of the tile fit on one SM. `--compare MAP` prints the
entries where two maps differ side by side: stop 37's whole-step search (`step_search.py`) picked
tiles the per-shape profile ranked lower, and this shows what they have in common.

    PYTHONPATH=/path/to/triton-3.6:. TRITON_INTERPRET=0 python benchmarks/mma_ablations/map_registers.py \\
        --compare benchmarks/results/policy_step_search_NVIDIA_H100_80GB_HBM3_w4a8_stop37.json.gz
"""
import argparse
import re
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tc_ablations"))
from map_spills import ptxas_verbose  # noqa: E402

from gearshift.kernels import int4_mma_gemv as mg  # noqa: E402
from gearshift.kernels.config import TileConfig  # noqa: E402
from gearshift.jsonfile import read_json  # noqa: E402

STRATEGIES = {"w4a16_mma": "bf16", "w4a8_mma_int8": "s8"}
SM_REGS, SM_WARPS, SM_CTAS, SM_SMEM = 65536, 64, 32, 228 * 1024
SIG = dict(x_ptr="*bf16", qw_ptr="*u8", s_ptr="*bf16", mn_ptr="*bf16", y_ptr="*bf16", ws_ptr="*fp32",
           cnt_ptr="*i32", xs_ptr="*fp32", M="i32", N="i32", K="i32", stride_xm="i32", stride_ym="i32")


def compile_tile(cfg: TileConfig, dt: str, m: int, k: int, fragment_order: bool | None = None, x_tiles: bool = False):
    """The fragment kernel of cfg for m tokens, compiled for sm_90 (no GPU needed). fragment_order (default: as
    the inputs' layout has it, `mma_gemv`'s rule): 16-bit inputs in fragment order."""
    fragment_order = (dt != "s8") if fragment_order is None and x_tiles else bool(fragment_order)
    tiles = 2 if m > 8 else 1
    sig = dict(SIG) | ({"x_ptr": "*i8"} if dt == "s8" else {})
    blocks = k // (mg.BLOCK_COLS * cfg.split_k * cfg.kwarps)
    asm = mg.block_asm(dt, cfg.bm, tiles, cfg.xshare, fragment_order, x_tiles=x_tiles)
    cx = dict(G=128, WARPS=cfg.warps, SPLIT_K=cfg.split_k, ASM=asm,
              CONSTRAINTS=mg.block_constraints(dt, cfg.bm, tiles, cfg.xshare), ROWS=cfg.bm, TILES=tiles, TG=1,
              ZPID=dt != "s8" and bool(mg.ONE_GROUP_Z), OFFSET=mg.OFFSET[dt], U=2 if cfg.prefetch else 1,
              HAS_XS=dt == "s8", PDL=True, L2_PREFETCH=False, LOAD=mg.WEIGHT_LOADS["plain"], SHINT=0, TILED=True,
              TRIGGER=mg.pdl_trigger(m, dt == "s8"), TAIL=0, KWARPS=cfg.kwarps, PRE=blocks if cfg.preload else 0,
              L2_AHEAD=0, EVEN=int(cfg.pairs), RES=0, GS=mg.group_signed(tiles, dt == "s8", False))
    dtype = torch.int8 if dt == "s8" else torch.bfloat16
    cx |= mg.ksum_args(cfg, tiles)
    if x_tiles:  # inputs in `to_x_tiles`' layout
        cx |= {"XT": 16 if dt == "s8" else 8, "XW": 64}
    if cfg.xshare:
        cx |= mg.xshare_args(tiles, cfg.kwarps, dtype)
    import inspect
    for n, par in inspect.signature(mg._mma_gemv_kernel.fn).parameters.items():
        if n not in sig and n not in cx and par.default is not inspect.Parameter.empty:
            cx[n] = par.default  # constexprs left out take the kernel's defaults, as a launch would
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items() if t.startswith("*") or n == "K"}
    src = ASTSource(fn=mg._mma_gemv_kernel, signature=sig | {n: "constexpr" for n in cx}, constexprs=cx, attrs=attrs)
    opts = {"num_warps": cfg.warps, "num_stages": 1, **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {})}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def ptxas_usage(ptx: str) -> dict:
    out = ptxas_verbose(ptx)
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spill = re.search(r"(\d+) bytes spill stores", out)
    return {"regs": regs, "spill": int(spill.group(1)) if spill else 0}


def ctas_per_sm(regs: int, warps: int, smem: int) -> int:
    per_warp = -(-regs * 32 // 256) * 256  # registers are allocated per warp in units of 256
    by_regs = SM_REGS // (per_warp * warps)
    by_smem = SM_SMEM // (smem + 1024) if smem else SM_CTAS  # (1 KB reserved per CTA)
    return min(by_regs, SM_WARPS // warps, SM_CTAS, by_smem)


def entries(path: str) -> dict:
    out = {}
    for key, per_m in read_json(path)["entries"].items():
        for m, e in per_m.items():
            if e.get("strategy") in STRATEGIES and e.get("config"):
                out[(key, int(m))] = (e["strategy"], TileConfig.from_dict(e["config"]))
    return out


def describe(strategy: str, cfg: TileConfig, key: str, m: int, cache: dict) -> str:
    k = int(key.split(":")[2].split("x")[1])
    tag = (strategy, cfg.key(), m > 8, k)
    if tag not in cache:
        kernel = compile_tile(cfg, STRATEGIES[strategy], m, k)
        u = ptxas_usage(kernel.asm["ptx"]) | {"smem": kernel.metadata.shared}  # (Triton's dynamic shared memory)
        u["ctas"] = ctas_per_sm(u["regs"], cfg.warps, u["smem"])
        cache[tag] = u
    u = cache[tag]
    return (f"{cfg.key():34s} {u['regs']:3d} regs, spill {u['spill']:3d} B, smem {u['smem']:5d} B: "
            f"{u['ctas']:2d} CTAs = {u['ctas'] * cfg.warps:2d} warps per SM")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    ap.add_argument("--compare", default="", help="a second map: print only the entries where the two differ")
    ap.add_argument("--modes", default="w4a16,w4a8,w4a4")
    ap.add_argument("--m", default="1,2,4,8,16,32")
    a = ap.parse_args()
    modes, ms = a.modes.split(","), {int(v) for v in a.m.split(",")}
    base = entries(a.map)
    other = entries(a.compare) if a.compare else {}
    cache: dict = {}
    for (key, m), (strategy, cfg) in sorted(base.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if key.split(":")[0] not in modes or m not in ms:
            continue
        if other:
            alt = other.get((key, m))
            if alt is None or alt[1].key() == cfg.key():
                continue
            print(f"{key} M={m}\n  map:     {describe(strategy, cfg, key, m, cache)}\n"
                  f"  compare: {describe(*alt, key, m, cache)}", flush=True)
        else:
            print(f"{key:24s} M={m:2d}  {describe(strategy, cfg, key, m, cache)}", flush=True)


if __name__ == "__main__":
    main()
