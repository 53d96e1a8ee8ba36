"""Where the small-M step's time goes above the floor: the whole step (the 128 Llama-3-8B linears
through the dispatcher and the shipped map, CUDA-graph replay) with the fragment kernel's block
PTX stripped one piece at a time (GPU; timing only, the stripped variants give wrong results).

- `shipped`: as the engine runs it;
- `no x loads`: the block's activation loads replaced by register moves (`xloads.no_xloads`);
- `loads only`: no unpacking and no MMAs: each output is the XOR of a weight word and an x word,
  so the weight and activation loads stay live and everything outside the block (scales, the
  fold FMAs, the in-CTA reduction, split-K, stores, PDL) is unchanged;
- `weights only`: the same without the x loads;
- `no sum MMAs`: shipped without the token-sum MMAs (A = 1.0), which the scale-after needs;
- `x ahead N` (same bits): each word's inputs loaded N words ahead of their k-steps instead of all at
  the block's top, so fewer input registers are live (at 16 tokens a 32-row lane holds 32 of them);
- `bf16 dequant`: no sum MMAs, and two bf16x2 FMAs per weight pair instead (offset off, s * q + m):
  the instruction stream of a kernel that dequantizes before the MMA;
  (these three apply to the xshare tiles' shared-memory blocks too; the three above run those as shipped)
- `trigger at exit` (--trigger-exit): shipped, but every launch lets its PDL successor in only at
  its exit (`int4_mma_gemv.TRIGGER = 0`);
- `no scale loads` (--no-scales): shipped, and stripped to its weights, without the scale / min loads
  (scale 1, min 0: `WEIGHT_LOAD["scales"] = 2`);
- `N per SM` (--residency N,...): shipped, every fragment launch capped at N CTAs per SM
  (`int4_mma_gemv.RESIDENCY`, `kernels/residency.py`): whether room on the SMs costs the step.

Next to them, in the same process: the streaming skeleton of `tc_ablations/grid_barrier.py`
(128 dependent PDL launches of a plain Triton loop, 16 KB per program, an 8 KB vector read after
the wait) and the copy bandwidth. If `weights only` is near the skeleton, the excess is in the
block's instructions; if it is near `shipped`, in the kernel's skeleton (grid, loads, reduction).

    PYTHONPATH=. python benchmarks/mma_ablations/step_ladder.py --m 1,2,4,8,16 --out benchmarks/results
"""
import argparse
import re
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tc_ablations"))
from kernel_bench import Model, codes_step_fn, producer_codes, tag_suffix, time_step, write_json  # noqa: E402
from xloads import no_xloads  # noqa: E402

import gearshift.kernels.int4_mma_gemv as mg  # noqa: E402
from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import device_slug, load_map_file  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, copy_bandwidth  # noqa: E402
from gearshift.quant.modes import MODES  # noqa: E402


def loads_only(asm: str, rows: int, tiles: int, x: bool) -> str:
    """A block PTX with the same operands as `asm` that only XORs its inputs into its outputs."""
    n_out = {8: 4, 16: 6, 32: 10}[rows] * tiles
    n_w = rows // 2
    lines = ["{", ".reg .b32 x<4>;"]
    if x:  # one 16-byte load per token tile and 16 columns, as the block makes
        for tile in range(tiles):
            for j in range(4):
                lines.append(f"ld.global.v4.b32 {{x0, x1, x2, x3}}, [${n_out + n_w + tile}+{16 * j}];")
                lines.append(f"xor.b32 x0, x0, x{1 + j % 3};")
    for i in range(n_out):
        w = f"${n_out + i % n_w}"
        lines.append(f"xor.b32 ${i}, {w}, {'x0' if x else f'${n_out + (i + 1) % n_w}'};")
    for i in range(n_out, n_w):  # every weight word stays live
        lines.append(f"xor.b32 $0, $0, ${n_out + i};")
    lines.append("}")
    return "\n".join(lines)


SUM_MMA = "{one, one, one, one}"


def no_sum_mma(asm: str) -> str:
    """The block without its token-sum MMAs (A = 1.0): what they cost (wrong results)."""
    return "\n".join(line for line in asm.split("\n") if SUM_MMA not in line)


def bf16_dequant(asm: str) -> str:
    """The block as a dequantize-before-MMA kernel would run it (timing only, wrong results): each
    bf16 pair 128 + q gets the offset removed and s * q + m applied in bf16x2 (two FMAs, with
    per-block stand-ins for s and m that ptxas cannot fold), and the token-sum MMAs are gone."""
    if "0x43004300" not in asm:
        return asm
    w0 = re.search(r"lop3\.b32 a0, (\$\d+),", asm).group(1)
    out = []
    for line in no_sum_mma(asm).split("\n"):
        out.append(line)
        if line.startswith("mov.b32 mg,"):
            out += [".reg .b32 n128, s2, m2;", "mov.b32 n128, 0xC300C300;", f"shr.b32 s2, {w0}, 31;",
                    "or.b32 s2, s2, 0x3F803F80;", f"shr.b32 m2, {w0}, 30;"]
        elif line.startswith("lop3.b32 "):
            reg = line.split()[1].rstrip(",")
            out += [f"fma.rn.bf16x2 {reg}, {reg}, one, n128;", f"fma.rn.bf16x2 {reg}, {reg}, s2, m2;"]
    return "\n".join(out)


def variants(s8: bool, shared: bool = False) -> dict:
    base = (mg.MMA_ASM_S8_SHARED if shared else mg.MMA_ASM_S8) if s8 else (mg.MMA_ASM_SHARED if shared else mg.MMA_ASM)
    keys = list(base)
    rt = (lambda k: k) if s8 else (lambda k: k[1:])
    out = {"shipped": dict(base),
           "no sum MMAs": {k: no_sum_mma(base[k]) for k in keys},
           "bf16 dequant": {k: bf16_dequant(base[k]) for k in keys}}
    if not s8:  # same bits: the inputs loaded N words ahead of their k-steps, not all at the block's top
        magic = {"bf16": 0x4300, "f16": 0x6400}
        for ahead in (0, 1, 2):
            out[f"x ahead {ahead}"] = {k: mg._mma_asm(k[0], magic[k[0]], k[1], k[2], shared=shared, x_ahead=ahead)
                                      for k in keys}
    if not shared:
        out |= {"no x loads": {k: no_xloads(base[k]) for k in keys},
                "loads only": {k: loads_only(base[k], *rt(k), x=True) for k in keys},
                "weights only": {k: loads_only(base[k], *rt(k), x=False) for k in keys}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="1,2,4,8,16")
    ap.add_argument("--mode", default="w4a16", choices=("w4a16", "w4a8"))
    ap.add_argument("--policy", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skeleton", action="store_true", help="also time the streaming skeleton chain")
    ap.add_argument("--no-strip", action="store_true", help="leave out the stripped-PTX variants")
    ap.add_argument("--only", default="", help="comma-separated variant names to time (default: all)")
    ap.add_argument("--trigger-exit", action="store_true", help="add the trigger-at-exit variant")
    ap.add_argument("--no-scales", action="store_true", help="add variants without the scale / min loads")
    ap.add_argument("--residency", default="", help="CTAs per SM caps to add as variants, e.g. 1,2,3")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    s8 = a.mode == "w4a8"
    shapes, layers = PRESETS["llama3-8b"]["shapes"], PRESETS["llama3-8b"]["layers"]
    model = Model("int4p" if s8 else "int4", shapes, layers, 128, torch.bfloat16, "blocks16")
    d = AdaptiveDispatcher(load_map_file(a.policy), autoload=False)
    act = MODES[a.mode].act
    copy_tbs = copy_bandwidth() / 1e12
    floor_ms = model.nbytes() / (copy_tbs * 1e12) * 1e3
    res = {"device": torch.cuda.get_device_name(), "mode": a.mode, "copy_tbs": copy_tbs, "floor_ms": floor_ms,
           "bytes": model.nbytes(), "ms": {}}
    print(f"copy {copy_tbs:.3f} TB/s, {model.nbytes() / 1e9:.3f} GB: floor {floor_ms:.3f} ms", flush=True)
    if a.skeleton:
        from grid_barrier import run as skeleton

        sk = skeleton(SimpleNamespace(layers=layers, per_sm=""), 16 * 256, 8 * 256, persistent_too=False)
        res["skeleton"] = sk
    table = mg.MMA_ASM_S8 if s8 else mg.MMA_ASM
    table_shared = mg.MMA_ASM_S8_SHARED if s8 else mg.MMA_ASM_SHARED
    asms = variants(s8)
    asms_shared = variants(s8, shared=True)
    # label -> (block PTX table, int4_mma_gemv switches)
    vs = {"shipped": (asms["shipped"], {})}
    if not a.no_strip:
        vs |= {name: (t, {}) for name, t in asms.items() if name != "shipped"}
    if a.only:
        keep = {"shipped", *a.only.split(",")}
        if keep - set(vs):
            raise SystemExit(f"--only: unknown variants {sorted(keep - set(vs))}; known: {sorted(vs)}")
        vs = {name: v for name, v in vs.items() if name in keep}
    if a.trigger_exit:
        vs["trigger at exit"] = (asms["shipped"], {"TRIGGER": 0})
    if a.no_scales:
        vs["no scale loads"] = (asms["shipped"], {"WEIGHT_LOAD": {"name": "plain", "scales": 2}})
        if not a.no_strip:
            vs["weights only, no scale loads"] = (asms["weights only"], {"WEIGHT_LOAD": {"name": "plain", "scales": 2}})
    for n in filter(None, a.residency.split(",")):
        vs[f"{n} per SM"] = (asms["shipped"], {"RESIDENCY": int(n)})
    defaults = {"TRIGGER": mg.TRIGGER, "RESIDENCY": mg.RESIDENCY, "WEIGHT_LOAD": mg.WEIGHT_LOAD}
    for m in (int(v) for v in a.m.split(",")):
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, _, k in shapes]
        codes = producer_codes(d, shapes, model.stores[0], xs, act, m) if act is not None else [None] * len(shapes)
        names = list(vs)
        t = {name: [] for name in names}
        for _ in range(a.rounds):
            for name in names:
                asm, sw = vs[name]
                table.update(asm)
                table_shared.update(asms_shared.get(name, asms_shared["shipped"]))
                for k, v in (defaults | sw).items():
                    setattr(mg, k, v)
                t[name].append(time_step(codes_step_fn(model, xs, d, act, codes)))
        table.update(asms["shipped"])
        table_shared.update(asms_shared["shipped"])
        for k, v in defaults.items():
            setattr(mg, k, v)
        res["ms"][m] = {name: statistics.median(v) for name, v in t.items()} | {"runs": t}
        print(f"M={m:2}: " + "  ".join(f"{name} {res['ms'][m][name]:.3f} ({res['ms'][m][name] / floor_ms:.2f}x)"
                                       for name in names), flush=True)
    write_json(a.out, f"step_ladder_{device_slug(res['device'])}{tag_suffix(a.tag)}_{a.mode}.json", res)


if __name__ == "__main__":
    main()
