"""How fast can a plain int8 GEMM run here, and would "int4-prog -> int8 once per call, then an
int8 GEMM with the same epilogue" beat `w4a8_progressive` at large M? (GPU; stop 29.)

Times, per Llama-3-8B shape and M, with CUDA-graph replay (`profiler.time_us`):
* `bf16`: cuBLAS on a dense bf16 copy (the issue's baseline);
* `int_mm`: `torch._int_mm` (cuBLAS int8 -> int32, no epilogue: a lower bound for that path);
* `tl_int8`: a Triton `tl.dot` int8 GEMM fed by TMA descriptors, y = bf16(float(acc) * unit[n] *
  xs[m]) fused (the progressive kernel's epilogue with one K slice, so the same bits), best of a
  small tile sweep;
* `tl_int4`: the same GEMM reading the int4-prog store itself (t * q - tz built in registers, staged
  by Triton through shared memory as `tl.dot`'s B operand), best of the BK = 128 tiles;
* `dequant8`: a Triton pass that writes the int4-prog store's int8 weights t * q - tz ([N, K]);
* `prog`: `w4a8_progressive` with the shipped map's tile for that shape and M.
The Triton GEMM's output is checked bit for bit against the progressive kernel's.

    PYTHONPATH=. python benchmarks/tc_ablations/int8_gemm_ceiling.py --m 1024,4096 --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gearshift.dispatch.profiler import PRESETS, random_store, time_us
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.config import TileConfig
from gearshift.kernels.w4a8_progressive import progressive_codes
from gearshift.quant.activations import ActQuantSpec

SHAPES = {name: (n, k) for name, n, k in PRESETS["llama3-8b"]["shapes"]}
# (BM, BN, BK, stages, warps, GROUP_M)
TILES = ((128, 256, 128, 3, 8, 8), (256, 128, 128, 3, 8, 8), (128, 256, 64, 4, 8, 8), (256, 128, 64, 4, 8, 8),
         (128, 128, 128, 4, 8, 8), (128, 128, 128, 4, 4, 8), (128, 256, 128, 4, 8, 8), (256, 128, 128, 4, 8, 16),
         (128, 128, 128, 3, 4, 8), (64, 128, 128, 4, 4, 8), (128, 64, 128, 4, 4, 8))


@triton.jit
def grouped_tile(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(m0, n0) of this program's output tile, GROUP_M token tiles per weight tile (L2 reuse)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    gsize = min(num_m - first_m, GROUP_M)
    return (first_m + (pid % in_group) % gsize) * BM, ((pid % in_group) // gsize) * BN


@triton.jit
def _int8_gemm(a_desc, b_desc, unit_ptr, xs_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, GROUP_M: tl.constexpr):
    m0, n0 = grouped_tile(M, N, BM, BN, GROUP_M)
    acc = tl.zeros([BM, BN], dtype=tl.int32)
    for k in range(0, K, BK):
        a = a_desc.load([m0, k])
        b = b_desc.load([n0, k])
        acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
    offs_m = m0 + tl.arange(0, BM)
    offs_n = n0 + tl.arange(0, BN)
    unit = tl.load(unit_ptr + offs_n)
    xs = tl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)
    out = acc.to(tl.float32) * unit[None, :] * xs[:, None]
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], out.to(tl.bfloat16), mask=(offs_m < M)[:, None])


@triton.jit
def _int4_gemm(a_desc, b_desc, s_ptr, mn_ptr, unit_ptr, xs_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, GROUP_M: tl.constexpr):
    """The same GEMM on the int4-prog store itself (rows layout, one group per K tile): the byte tile
    comes by TMA, t * q - tz is built in registers and `tl.dot` takes it as its B operand (Triton
    stages a register B through shared memory)."""
    m0, n0 = grouped_tile(M, N, BM, BN, GROUP_M)
    offs_n = n0 + tl.arange(0, BN)
    inv = 1.0 / tl.load(unit_ptr + offs_n)
    acc = tl.zeros([BM, BN], dtype=tl.int32)
    for k in range(0, K, BK):
        a = a_desc.load([m0, k])
        b = b_desc.load([n0, k // 2]).to(tl.int32)
        g = k // BK
        t = (tl.load(s_ptr + offs_n * (K // BK) + g).to(tl.float32) * inv).to(tl.int32)
        tz = -(tl.load(mn_ptr + offs_n * (K // BK) + g).to(tl.float32) * inv).to(tl.int32)
        lo = (b & 15) * t[:, None] - tz[:, None]
        hi = (b >> 4) * t[:, None] - tz[:, None]
        w = tl.reshape(tl.join(lo, hi), [BN, BK]).to(tl.int8)
        acc = tl.dot(a, w.T, acc, out_dtype=tl.int32)
    offs_m = m0 + tl.arange(0, BM)
    unit = tl.load(unit_ptr + offs_n)
    xs = tl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)
    out = acc.to(tl.float32) * unit[None, :] * xs[:, None]
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], out.to(tl.bfloat16), mask=(offs_m < M)[:, None])


def int4_gemm(codes, store, unit, xs, tile):
    """`_int4_gemm` on a rows-layout int4-prog store; BK must be the group size."""
    bm, bn, bk, st, wp, gm = tile
    m, k = codes.shape
    n = store.out_features
    y = torch.empty(m, n, device=codes.device, dtype=torch.bfloat16)
    a_desc = TensorDescriptor.from_tensor(codes, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(store.qweight, [bn, bk // 2])
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    return lambda: _int4_gemm[grid](a_desc, b_desc, store.scales, store.mins, unit, xs, y, m, n, k, BM=bm, BN=bn,
                                    BK=bk, GROUP_M=gm, num_stages=st, num_warps=wp), y


@triton.jit
def _dequant8(qw_ptr, s_ptr, mn_ptr, unit_ptr, w_ptr, K, G: tl.constexpr, BN: tl.constexpr):
    """Rows store: byte j of a row holds columns 2j (low nibble) and 2j + 1."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    g = tl.program_id(1)
    HG: tl.constexpr = G // 2
    b = tl.load(qw_ptr + rows[:, None] * (K // 2) + g * HG + tl.arange(0, HG)[None, :]).to(tl.int32)
    inv = 1.0 / tl.load(unit_ptr + rows)
    t = (tl.load(s_ptr + rows * (K // G) + g).to(tl.float32) * inv).to(tl.int32)
    tz = -(tl.load(mn_ptr + rows * (K // G) + g).to(tl.float32) * inv).to(tl.int32)
    lo = (b & 15) * t[:, None] - tz[:, None]
    hi = (b >> 4) * t[:, None] - tz[:, None]
    w = tl.reshape(tl.join(lo, hi), [BN, G]).to(tl.int8)
    tl.store(w_ptr + rows[:, None] * K + g * G + tl.arange(0, G)[None, :], w)


def int8_gemm(codes, w8, unit, xs, tile):
    bm, bn, bk, st, wp, gm = tile
    m, k = codes.shape
    n = w8.shape[0]
    y = torch.empty(m, n, device=codes.device, dtype=torch.bfloat16)
    a_desc = TensorDescriptor.from_tensor(codes, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(w8, [bn, bk])
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    return lambda: _int8_gemm[grid](a_desc, b_desc, unit, xs, y, m, n, k, BM=bm, BN=bn, BK=bk, GROUP_M=gm,
                                    num_stages=st, num_warps=wp), y


def sweep(r: dict, prefix: str, name: str, tiles, make, yp, exact: bool) -> None:
    """Time make(tile) for every tile into r (checking its bits against the progressive kernel's
    output yp where `exact`), and the best as r[name + "_us"] / r[name + "_tile"]."""
    best = None
    for tile in tiles:
        try:
            f, y = make(tile)
            f()
            torch.cuda.synchronize()
            same = torch.equal(y, yp) if exact else None
            t = time_us([f])
        except Exception as ex:  # noqa: BLE001 - report the tile, keep going
            r[f"{prefix}_{tile}"] = f"error: {str(ex)[:120]}"
            continue
        r[f"{prefix}_{tile}"] = {"us": t, "same_bits_as_prog": same}
        if best is None or t < best[0]:
            best = (t, tile)
    if best:
        r[f"{name}_us"], r[f"{name}_tile"] = best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="1024,2048,4096")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    shipped = json.load(open("gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json"))["entries"]
    rows, dev = [], torch.cuda.get_device_name()
    for name in a.shapes.split(","):
        n, k = SHAPES[name]
        store = random_store("int4p", n, k, 128, "cuda", layout="rows")
        w8 = torch.empty(n, k, device="cuda", dtype=torch.int8)
        dq = lambda: _dequant8[(n // 64, k // 128)](store.qweight, store.scales, store.mins, store.row_units, w8, k,
                                                    G=128, BN=64)
        dq()
        assert torch.equal(w8, store.int8_weights()), "dequant8 != Int4Weight.int8_weights"
        t_dq = time_us([dq])
        wd = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        unit = store.row_units.float().contiguous()
        for m in [int(v) for v in a.m.split(",")]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            codes, xs = quantize_act_triton(x, ActQuantSpec("int8"))
            r = {"shape": name, "n": n, "k": k, "m": m, "dequant8_us": t_dq}
            r["bf16_us"] = time_us([lambda: x @ wd.t()])
            try:
                r["int_mm_us"] = time_us([lambda: torch._int_mm(codes, w8.t())])
            except Exception as e:  # noqa: BLE001 - report, keep going
                r["int_mm_us"], r["int_mm_error"] = None, str(e)[:200]
            e = shipped[f"w4a8:g128:{n}x{k}"][str(m)]
            cfg = TileConfig.from_dict(e["config"])
            yp = progressive_codes(codes, xs, store, cfg, torch.bfloat16)
            r["prog_us"] = time_us([lambda: progressive_codes(codes, xs, store, cfg, torch.bfloat16)])
            r["prog_cfg"] = e["config"]
            exact = cfg.split_k == 1 and not cfg.stream_k  # (a split tile of the map rounds differently)
            sweep(r, "tl", "tl_int8", TILES, lambda tile: int8_gemm(codes, w8, unit, xs, tile), yp, exact)
            sweep(r, "tl4", "tl_int4", [t for t in TILES if t[2] == 128],
                  lambda tile: int4_gemm(codes, store, unit, xs, tile), yp, exact)
            ops = 2 * m * n * k
            for key in ("bf16_us", "int_mm_us", "prog_us", "tl_int8_us", "tl_int4_us"):
                if r.get(key):
                    r[key.replace("_us", "_tops")] = ops / r[key] / 1e6
            rows.append(r)
            print(f"{name:8s} M={m:5d} bf16 {r['bf16_us']:8.1f} int_mm {r['int_mm_us'] or 0:8.1f} "
                  f"prog {r['prog_us']:8.1f} tl_int8 {r.get('tl_int8_us', 0):8.1f} {r.get('tl_int8_tile')} "
                  f"tl_int4 {r.get('tl_int4_us', 0):8.1f} {r.get('tl_int4_tile')} "
                  f"dequant8 {t_dq:6.1f} us", flush=True)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"int8_gemm_ceiling_{dev.replace(' ', '_')}.json")
    json.dump({"device": dev, "torch": torch.__version__, "triton": triton.__version__, "rows": rows}, open(path, "w"),
              indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
