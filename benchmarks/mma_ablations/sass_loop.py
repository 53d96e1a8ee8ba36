"""What the small-M fragment tiles of a policy map spend per 128-column block, in sm_90 SASS (CPU, no GPU).

Stop 52 found the one-token W4A16 step on the H200 bound by the block's instructions, not by bytes in
flight (`results/h200_stop52.md`). This compiles each W4A16 fragment tile the map launches at the given
M as the engine launches it (`map_registers.compile_tile`), disassembles the cubin with Triton's
nvdisasm, and counts the main loop's SASS per block by kind:
- `unpack`: LOP3 / SHF on the weight words (nibble pairs into bf16), `pair x`: PRMT,
- `mma`: HMMA (IMMA for W4A8's int8 codes, `--mode w4a8`), `loads`: LDG / LDS, `fold`: FFMA, `const`: moves of
  immediates (the asm's magic and 1.0 operands, set again every block), `copy`: register-to-register moves (the loop's rotation of
  its prefetched registers), `other`: integer and address arithmetic, compares, branches.
Preload tiles (whole K slice before the PDL wait) have no loop; their straight-line kernel is counted
instead and divided by the blocks per warp.

    PYTHONPATH=/path/to/triton-3.6:. TRITON_INTERPRET=0 python benchmarks/mma_ablations/sass_loop.py --m 1,8
    ... sass_loop.py --mode w4a8 --m 1,16 --fragment-order   # int8 codes in S8_FRAGMENT_ORDER (stop 69)
    ... sass_loop.py --m 1,16 --fragment-order --group-index unsigned   # stop 70's group division
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from map_registers import compile_tile, entries  # noqa: E402

from gearshift.kernels import int4_mma_gemv as mg  # noqa: E402

NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL = re.compile(r"\s*(\.L_x_\d+):")
MODES = {"w4a16": ("w4a16_mma", "bf16"), "w4a8": ("w4a8_mma_int8", "s8")}
KINDS = ("unpack", "pair x", "mma", "loads", "fold", "const", "copy", "other")


def sass(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([NVDISASM, "-c", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def kind(op: str, args: str) -> str:
    base = op.split(".")[0]
    if base in ("LOP3", "SHF"):
        return "unpack"
    if base == "PRMT":
        return "pair x"
    if base in ("HMMA", "IMMA"):
        return "mma"
    if base in ("LDG", "LDS", "LDL"):
        return "loads"
    if base == "FFMA":
        return "fold"
    if op.startswith("IMAD.MOV") or base == "MOV":
        return "const" if re.search(r",\s*(0x[0-9a-f]+|-?\d+)\s*$", args) else "copy"
    return "other"


def blocks_of(text: str) -> dict[str, list[tuple[str, str]]]:
    """Label -> the (opcode, operands) between it and the next label."""
    out, cur, name = {}, [], "entry"
    for line in text.splitlines():
        lab = LABEL.match(line)
        if lab:
            out[name], cur, name = cur, [], lab.group(1)
            continue
        m = OP.search(line)
        if m:
            cur.append((m.group(1), m.group(2)))
    out[name] = cur
    return out


def per_block(cfg, m: int, k: int, fragment_order: bool = False,
              dt: str = "bf16") -> tuple[str, float, collections.Counter]:
    """('loop' or 'straight', blocks the counted code covers, kind -> instructions); fragment_order: the
    kernel for inputs in fragment order (`int4_mma_gemv.to_fragment_order`); dt: 'bf16' or int8 codes 's8'."""
    code = blocks_of(sass(compile_tile(cfg, dt, m, k, fragment_order).asm["cubin"]))
    loops = [body for name, body in code.items()
             if body and body[-1][0].startswith("BRA") and f"`({name})" in body[-1][1]]
    if loops:
        body = max(loops, key=lambda b: sum(op.startswith(("HMMA", "IMMA")) for op, _ in b))
        where, blocks = "loop", 2 if cfg.pairs else 1
    else:
        body = [ins for b in code.values() for ins in b]
        where, blocks = "straight", k // (mg.BLOCK_COLS * cfg.split_k * cfg.kwarps)
    return where, blocks, collections.Counter(kind(op, args) for op, args in body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    ap.add_argument("--m", default="1,8", help="token counts (1..8: one 8-token MMA tile)")
    ap.add_argument("--fragment-order", action="store_true", help="the kernels for inputs in fragment order")
    ap.add_argument("--mode", choices=sorted(MODES), default="w4a16",
                    help="w4a16: bf16 inputs; w4a8: int8 codes (the map's w4a8_mma_int8 tiles)")
    ap.add_argument("--group-index", choices=("rule", "signed", "unsigned"), default="rule",
                    help="the scale group index's division (`switches.group_signed`; stop 70)")
    a = ap.parse_args()
    mg.GROUP_SIGNED = {"rule": -1, "signed": 1, "unsigned": 0}[a.group_index]
    strategy, dt = MODES[a.mode]
    if not os.path.exists(NVDISASM):
        raise SystemExit(f"no nvdisasm in this Triton ({NVDISASM})")
    print(f"Triton {triton.__version__}; SASS per 128-column block of each tile's main loop")
    print(f"{'shape':24s} {'M':>2s} {'tile':34s} {'code':8s} {'total':>6s} " + " ".join(f"{k:>7s}" for k in KINDS))
    for (key, m), (s, cfg) in sorted(entries(a.map).items()):
        if s != strategy or not key.startswith(a.mode + ":") or m not in {int(v) for v in a.m.split(",")}:
            continue
        k = int(key.split(":")[2].split("x")[1])
        where, blocks, c = per_block(cfg, m, k, a.fragment_order, dt)
        total = sum(c.values()) / blocks
        print(f"{key:24s} {m:2d} {cfg.key():34s} {where:8s} {total:6.1f} "
              + " ".join(f"{c[kd] / blocks:7.1f}" for kd in KINDS), flush=True)


if __name__ == "__main__":
    main()
