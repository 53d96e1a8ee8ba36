"""Register spills of every Gluon wgmma tile a policy map launches (CPU, no GPU needed).

Compiles each distinct `w4a16_wgmma` and `w4a8_progressive` tile of the map for sm_90 as the
engine launches it (bf16 activations, blocks16 int4 stores; W4A16 with PDL and the fp32 dequant
of plain int4 stores), runs Triton's bundled ptxas with -v and prints the spill bytes, ptxas's
wgmma serialization warnings (C75xx) and which (mode, shape, M) entries use the tile. Spills in a
kernel's main loop cost time on every K tile; stop 26 found 468-896 bytes in the split-K epilogue
this way, and 244 bytes in the epilogue of the W4A8 256 x 128 tile (`docs/kernels.md`).

    TRITON_INTERPRET=0 python benchmarks/tc_ablations/map_spills.py [--map gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json]
"""
import argparse
import subprocess
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

from gearshift.dispatch.profiler import random_store
from gearshift.kernels import w4a8_progressive as P
from gearshift.kernels import w4a8_wgmma as W8
from gearshift.kernels import w4a16_wgmma as W
from gearshift.kernels.config import TileConfig
from gearshift.jsonfile import read_json

TWO_REGS = W.TWO_CONSUMER_REGS


def _compile(fn, sig: dict, cx: dict, divisible: tuple, warps: int, maxnreg: int) -> str:
    sig = dict(sig) | {name: "constexpr" for name in cx}
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = GluonASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in cx.items()}, attrs=attrs)
    opts = {"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]


def wgmma_ptx(cfg: TileConfig) -> str:
    """`w4a16_wgmma` as launched on plain int4 blocks16 stores with bf16 activations."""
    two = W._two_consumers(cfg)
    st = random_store("int4", 4096, 4096, 128, "cpu", layout="blocks16")
    xd, wd = W._descriptors(torch.empty(cfg.bm, 4096, dtype=torch.bfloat16), st, cfg.bm, cfg.bn, cfg.bk)
    sig = {"x_desc": mangle_type(xd), "w_desc": mangle_type(wd), "s_ptr": "*fp16", "mn_ptr": "*fp16",
           "y_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "xs_ptr": "*fp32", "M": "i32", "N": "i32",
           "K": "i32", "per": "i32", "dpt": "i32"}
    cx = {"G": 128, "BN": cfg.bn, "STAGES": cfg.stages, "BLOCKS": True, "F16": False, "A_SMEM": cfg.a_smem,
          "SPLIT_K": cfg.split_k, "CONSUMERS": 2 if two else 1, "TOKEN_SCALES": False,
          "STREAM_K": bool(cfg.stream_k), "CMAX": 3, "PACKED": False, "PDL": W.WGMMA_PDL,
          "num_warps": cfg.warps // (2 if two else 1), "VEC_STORE": W.WGMMA_VEC_STORE}  # (kernel parameter order)
    return _compile(W.w4a16_wgmma_kernel, sig, cx, ("s_ptr", "mn_ptr", "y_ptr", "N", "K"), cx["num_warps"],
                    cfg.maxnreg or (TWO_REGS if cfg.warps == 8 and not cfg.a_smem else 0))


def progressive_ptx(cfg: TileConfig) -> str:
    """`w4a8_progressive` as launched on int4-prog blocks16 stores."""
    two = cfg.warps == 8
    st = random_store("int4p", 4096, 4096, 128, "cpu", layout="blocks16")
    xd = W8._code_descriptor(torch.empty(cfg.bm, 4096, dtype=torch.int8), cfg.bm, 128)
    wd = W._weight_descriptor(st, cfg.bn, 128, swizzle=64)
    sd, md = W8.group_descriptors(st, cfg.bn)
    sig = {"x_desc": mangle_type(xd), "w_desc": mangle_type(wd), "sc_desc": mangle_type(sd),
           "mn_desc": mangle_type(md), "units_ptr": "*fp32", "xs_ptr": "*fp32", "y_ptr": "*bf16",
           "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "per": "i32", "dpt": "i32"}
    cx = {"G": 128, "BN": cfg.bn, "STAGES": cfg.stages, "BLOCKS": True, "SPLIT_K": cfg.split_k,
          "CONSUMERS": 2 if two else 1, "num_warps": cfg.warps // (2 if two else 1), "ABLATE": 0,
          "STREAM_K": bool(cfg.stream_k), "CMAX": 3, "PDL": P.PROGRESSIVE_PDL,
          "VEC_STORE": P.PROGRESSIVE_VEC_STORE}
    return _compile(P.w4a8_progressive_kernel, sig, cx, ("y_ptr", "N", "K"), cx["num_warps"],
                    cfg.maxnreg or (TWO_REGS if two else 0))


def ptxas_verbose(ptx: str) -> str:
    """What Triton's bundled ptxas -v prints for the PTX, compiled for sm_90a."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        r = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"],
                           capture_output=True, text=True)
    return r.stdout + r.stderr


def ptxas_report(ptx: str) -> str:
    """ptxas -v's spill line and any wgmma serialization warning for sm_90a."""
    lines = ptxas_verbose(ptx).splitlines()
    spill = next((ln.strip() for ln in lines if "spill" in ln), "?")
    warn = sorted({ln[ln.find("(C75"):ln.find("(C75") + 7] for ln in lines if "(C75" in ln})
    return spill + (f"  {' '.join(warn)}" if warn else "")


COMPILERS = {"w4a16_wgmma": wgmma_ptx, "w4a8_progressive": progressive_ptx}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    a = ap.parse_args()
    uses: dict[tuple, list[str]] = {}
    for key, per_m in read_json(a.map)["entries"].items():
        mode, _, shape = key.split(":")
        for m, e in per_m.items():
            if e.get("strategy") in COMPILERS and e.get("config"):
                cfg = TileConfig.from_dict(e["config"])
                uses.setdefault((e["strategy"], cfg), []).append(f"{mode} {shape} M={m}")
    for (strategy, cfg), where in sorted(uses.items(), key=lambda kv: (kv[0][0], kv[0][1].key())):
        try:
            report = ptxas_report(COMPILERS[strategy](cfg))
        except Exception as e:  # a tile this Triton cannot compile is reported, the audit goes on
            report = f"compile failed: {type(e).__name__}: {str(e)[:120]}"
        print(f"{strategy:17s} {cfg.key():28s} {report}\n{'':46s} used by {len(where)}: {', '.join(where[:4])}"
              + (" ..." if len(where) > 4 else ""), flush=True)


if __name__ == "__main__":
    main()
