"""W4A16 (and W4A8/W4A4 via exact codes) for 1..16 tokens: `mma.sync` fragments built in registers.

Why: a CUDA-core GEMV spends >= 3 instructions per int4 weight (unpack, convert, FMA) and tops
out near 2x the weight-read floor on the H100; Triton's `tl.dot` routes both operands through
shared memory, which costs more than the math at M <= 16. Here each lane turns its own int4
words straight into the A fragment of `mma.m16n8k16` (bf16/fp16) and its token's inputs into the
B fragment, so a weight costs ~1 instruction (SHF/LOP3 on two nibbles at once) and the tensor
core does the multiply-add.

Fragment plan (lane = 4*g + t, g = 0..7, t = 0..3; one warp owns 8 weight rows):
* lane (g, t) of warp w holds words 4t..4t+3 of a 128-column block of row 8w + g (one 16-byte
  load, prefetched a block ahead); every index comes from the lane's own %tid.x, so the plan does
  not depend on how Triton lays out its tensors (one element per thread);
* A rows 0..7 = weight rows: a word's nibbles (0,4), (1,5), (2,6), (3,7) become bf16 pairs with
  one AND/OR each: (w >> 4i) & 0x000F000F | 0x4300_4300 reads as (128 + q_a, 128 + q_b)
  (0x6400 / 1024 for fp16); the MMA's k-order is a permutation of the block's columns and the B
  fragment uses the same one (PRMT of the token's 8 inputs per word);
* A rows 8..15 = 1.0, so D rows 8..15 = sum(x) over the block: the min term and the +128 offset
  need it, and it lands in the same lane as the row's dot product;
* B column n = g is token g of an 8-token tile (lanes of absent tokens load token M-1, and those
  columns are never stored): D[g, 2t + e] for e = 0, 1 is row g x token 2t + e; 9..16 tokens run
  a second tile against the same A registers.
Per block and row: y += s * (D - 128 X) + m * X = s * D + (m - 128 s) * X (fp32, scale-after, a
block never straddles a scale group). Split-K over programs with the deterministic one-launch
reduction of `splitk.py`. DPR: P_W = (4) padded to bf16, P_X = (16), bf16 tensor cores.
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, cdiv, tl, triton
from gearshift.kernels.config import TileConfig
from gearshift.kernels.pdl import l2_prefetch_enabled, launch_kwargs, pdl_enabled
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.splitk import splitk_buffers
from gearshift.quant.int4 import BLOCKS16, Int4Weight

BLOCK_COLS = 128  # columns per fragment call: 4 lanes x 4 words x 8 nibbles
MAX_TOKENS = 16  # MMA n = 8 tokens per tile, two tiles per lane


def _mma_asm(dt: str, magic: int, two_rows: bool, tiles: int = 1, chains: int = 1) -> str:
    """PTX for one 128-column block of one warp, run once per lane (pack 1).

    Inputs: the lane's 4 words of row a (A row g), then of row b (A row g+8) if two_rows, then one
    pointer per token tile to that tile's token-g inputs for the lane's first word.
    Outputs per token tile, in order: D[a,2t], D[a,2t+1], (D[b,2t], D[b,2t+1],) X[2t], X[2t+1].
    One row per lane: A rows 8..15 are 1.0, so D rows 8..15 are X = sum(x) over the block. Two
    rows per lane: a second MMA with A = 1.0 gives X. Two token tiles share the A fragments.
    chains > 1 (an ablation, benchmarks/mma_ablations/chains.py: no faster on the H100): the
    block's MMAs alternate between that many accumulator sets, summed at the end.
    """
    mm = f"0x{magic:04X}{magic:04X}"
    one = "0x3F803F80" if dt == "bf16" else "0x3C003C00"
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{dt}.{dt}.f32"
    n_out = (6 if two_rows else 4) * tiles
    wa0 = n_out
    wb0 = wa0 + 4
    xp0 = wa0 + (8 if two_rows else 4)
    lines = ["{", ".reg .b32 a0, a1, a2, a3, one, b0, b1, t;", f".reg .b32 x<{16 * tiles}>;",
             f".reg .f32 d<{4 * tiles * chains}>, e<{4 * tiles * chains}>;", f"mov.b32 one, {one};"]
    lines += [f"mov.f32 {r}{i}, 0f00000000;" for r in "de" for i in range(4 * tiles * chains)]

    def pair(reg: str, word: str, shift: int) -> None:
        src = word
        if shift:
            lines.append(f"shr.b32 t, {word}, {shift};")
            src = "t"
        lines.append(f"and.b32 {reg}, {src}, 0x000F000F;")
        lines.append(f"or.b32 {reg}, {reg}, {mm};")

    for tile in range(tiles):  # all of the block's inputs first: one L1 round trip
        for j in range(4):
            x = [f"x{16 * tile + 4 * j + i}" for i in range(4)]
            lines.append(f"ld.global.v4.b32 {{{', '.join(x)}}}, [${xp0 + tile}+{16 * j}];")
    for j in range(4):
        for half in range(2):
            pair("a0", f"${wa0 + j}", 8 * half)
            pair("a2", f"${wa0 + j}", 8 * half + 4)
            if two_rows:
                pair("a1", f"${wb0 + j}", 8 * half)
                pair("a3", f"${wb0 + j}", 8 * half + 4)
            bank = 4 * tiles * ((2 * j + half) % chains)
            for tile in range(tiles):
                lo, hi = f"x{16 * tile + 4 * j + half}", f"x{16 * tile + 4 * j + half + 2}"
                d = ", ".join(f"d{bank + 4 * tile + i}" for i in range(4))
                e = ", ".join(f"e{bank + 4 * tile + i}" for i in range(4))
                lines.append(f"prmt.b32 b0, {lo}, {hi}, 0x5410;")
                lines.append(f"prmt.b32 b1, {lo}, {hi}, 0x7632;")
                if two_rows:
                    lines.append(f"{mma} {{{d}}}, {{a0, a1, a2, a3}}, {{b0, b1}}, {{{d}}};")
                    lines.append(f"{mma} {{{e}}}, {{one, one, one, one}}, {{b0, b1}}, {{{e}}};")
                else:
                    lines.append(f"{mma} {{{d}}}, {{a0, one, a2, one}}, {{b0, b1}}, {{{d}}};")
    for c in range(1, chains):
        lines += [f"add.f32 {r}{i}, {r}{i}, {r}{4 * tiles * c + i};" for r in "de" for i in range(4 * tiles)]
    outs = []
    for tile in range(tiles):
        o = 4 * tile
        outs += ([f"d{o}", f"d{o + 1}", f"d{o + 2}", f"d{o + 3}", f"e{o}", f"e{o + 1}"] if two_rows
                 else [f"d{o}", f"d{o + 1}", f"d{o + 2}", f"d{o + 3}"])
    lines += [f"mov.b32 ${i}, {v};" for i, v in enumerate(outs)]
    lines.append("}")
    return "\n".join(lines)


MMA_ASM = {(dt, two, tiles): _mma_asm(dt, magic, two, tiles) for dt, magic in (("bf16", 0x4300), ("f16", 0x6400))
           for two in (False, True) for tiles in (1, 2)}
OFFSET = {"bf16": 128.0, "f16": 1024.0}
# PTX of the weight loads (16 bytes per lane and row, read once: no L1 allocation). The L2 prefetch-size
# forms make the row's next blocks L2 hits; benchmarks/mma_ablations/loads.py times them.
WEIGHT_LOADS = {
    "plain": "ld.global.nc.L1::no_allocate.v4.b32 {$0, $1, $2, $3}, [$4];",
    "l2_128": "ld.global.nc.L1::no_allocate.L2::128B.v4.b32 {$0, $1, $2, $3}, [$4];",
    "l2_256": "ld.global.nc.L1::no_allocate.L2::256B.v4.b32 {$0, $1, $2, $3}, [$4];",
}
WEIGHT_LOAD = {"name": "plain", "scales": 0}  # scales 1: the scale/min loads with an L2 prefetch size too
CONSTRAINTS = {(two, tiles): ",".join(["=r"] * ((6 if two else 4) * tiles) + ["r"] * (8 if two else 4) + ["l"] * tiles)
               for two in (False, True) for tiles in (1, 2)}

if HAS_TRITON:
    from gearshift.kernels.pdl import grid_wait, launch_dependents, prefetch_l2
    from gearshift.kernels.splitk import splitk_finish

    @triton.jit
    def _thread_id(like):
        """%tid.x of the thread holding each element (not pure: never rematerialized elsewhere)."""
        return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r,r", [like], dtype=tl.int32, is_pure=False,
                                         pack=1)


    @triton.jit
    def _load16(ptr, LOAD: tl.constexpr):
        """The 4 int32 words at ptr (16 bytes) in the calling thread's registers."""
        return tl.inline_asm_elementwise(LOAD, "=r,=r,=r,=r,l", [ptr],
                                         dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=False, pack=1)


    @triton.jit
    def _load_half(ptr, HINT: tl.constexpr):
        """One 16-bit scale or min; HINT: with an L2 prefetch size (the row's next groups come along)."""
        if HINT == 0:
            return tl.load(ptr)
        v = tl.inline_asm_elementwise("ld.global.nc.L2::256B.b16 $0, [$1];", "=h,l", [ptr], dtype=tl.int16,
                                      is_pure=False, pack=1)
        return v.to(ptr.dtype.element_ty, bitcast=True)


    @triton.jit
    def _load_scales(s_ptr, mn_ptr, sa_off, sb_off, g, TWO_ROWS: tl.constexpr, HINT: tl.constexpr):
        sa = _load_half(s_ptr + sa_off + g, HINT)
        ma = _load_half(mn_ptr + sa_off + g, HINT)
        if TWO_ROWS:
            return sa, ma, _load_half(s_ptr + sb_off + g, HINT), _load_half(mn_ptr + sb_off + g, HINT)
        return sa, ma, sa, ma


    @triton.jit
    def _load_rows(wa_ptr, wb_ptr, kw, TWO_ROWS: tl.constexpr, LOAD: tl.constexpr, TILED: tl.constexpr):
        if TILED:
            kw = kw * 16  # 16 words of a row per block -> 256 words of the 16-row chunk
        a0, a1, a2, a3 = _load16(wa_ptr + kw, LOAD)
        if TWO_ROWS:
            b0, b1, b2, b3 = _load16(wb_ptr + kw, LOAD)
            return a0, a1, a2, a3, b0, b1, b2, b3
        return a0, a1, a2, a3, a0, a1, a2, a3


    @triton.jit
    def _fold(d0, d1, e0, e1, sa, ma, acc0, acc1):
        return acc0 + sa * d0 + ma * e0, acc1 + sa * d1 + ma * e1


    @triton.jit
    def _block(ASM: tl.constexpr, CONSTRAINTS: tl.constexpr, TWO_ROWS: tl.constexpr, TILES: tl.constexpr,
               OFFSET: tl.constexpr, a0, a1, a2, a3, b0, b1, b2, b3, xp, xp1, sc, acc):
        """One 128-column block: the fragment MMAs, then scale-after into the fp32 accumulators
        acc = (row a tok 2t, row a tok 2t+1, row b ..., row b ...) for tile 0, then tile 1."""
        s_a, m_a, s_b, m_b = sc
        sa = s_a.to(tl.float32)
        ma = m_a.to(tl.float32) - OFFSET * sa
        sb = s_b.to(tl.float32)
        mb = m_b.to(tl.float32) - OFFSET * sb
        p0, p1, p2, p3, q0, q1, q2, q3 = acc
        if TWO_ROWS:
            if TILES == 2:
                da0, da1, db0, db1, e0, e1, fa0, fa1, fb0, fb1, f0, f1 = tl.inline_asm_elementwise(
                    ASM, CONSTRAINTS, [a0, a1, a2, a3, b0, b1, b2, b3, xp, xp1],
                    dtype=(tl.float32,) * 12, is_pure=True, pack=1)
            else:
                da0, da1, db0, db1, e0, e1 = tl.inline_asm_elementwise(
                    ASM, CONSTRAINTS, [a0, a1, a2, a3, b0, b1, b2, b3, xp], dtype=(tl.float32,) * 6, is_pure=True,
                    pack=1)
            p0, p1 = _fold(da0, da1, e0, e1, sa, ma, p0, p1)
            p2, p3 = _fold(db0, db1, e0, e1, sb, mb, p2, p3)
            if TILES == 2:
                q0, q1 = _fold(fa0, fa1, f0, f1, sa, ma, q0, q1)
                q2, q3 = _fold(fb0, fb1, f0, f1, sb, mb, q2, q3)
        else:
            if TILES == 2:
                da0, da1, e0, e1, fa0, fa1, f0, f1 = tl.inline_asm_elementwise(
                    ASM, CONSTRAINTS, [a0, a1, a2, a3, xp, xp1], dtype=(tl.float32,) * 8, is_pure=True, pack=1)
                q0, q1 = _fold(fa0, fa1, f0, f1, sa, ma, q0, q1)
            else:
                da0, da1, e0, e1 = tl.inline_asm_elementwise(ASM, CONSTRAINTS, [a0, a1, a2, a3, xp],
                                                             dtype=(tl.float32,) * 4, is_pure=True, pack=1)
            p0, p1 = _fold(da0, da1, e0, e1, sa, ma, p0, p1)
        return p0, p1, p2, p3, q0, q1, q2, q3


    @triton.jit
    def _mma_gemv_kernel(x_ptr, qw_ptr, s_ptr, mn_ptr, y_ptr, ws_ptr, cnt_ptr, xs_ptr, M, N, K, stride_xm, stride_ym,
                         G: tl.constexpr, WARPS: tl.constexpr, SPLIT_K: tl.constexpr, ASM: tl.constexpr,
                         CONSTRAINTS: tl.constexpr, TWO_ROWS: tl.constexpr, TILES: tl.constexpr,
                         OFFSET: tl.constexpr, U: tl.constexpr, HAS_XS: tl.constexpr, PDL: tl.constexpr,
                         L2_PREFETCH: tl.constexpr, LOAD: tl.constexpr, SHINT: tl.constexpr, TILED: tl.constexpr,
                         TRIGGER: tl.constexpr = 1, TAIL: tl.constexpr = 0, KWARPS: tl.constexpr = 1):
        # Every per-lane quantity comes from the lane's own %tid.x, so the fragment plan holds
        # whatever layout Triton picks for these [32 * WARPS] tensors (one element per thread).
        # KWARPS > 1: each group of KWARPS consecutive warps shares one set of rows, warp w of the
        # group runs the w-th K slice of the program's, and the group's partials are summed in the
        # CTA (shared memory) before the store: a K split without the global split-K tail.
        RPW: tl.constexpr = 16 if TWO_ROWS else 8
        RG: tl.constexpr = WARPS // KWARPS
        BN: tl.constexpr = RPW * RG
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        m0_tok = tl.program_id(2) * 8 * TILES  # B columns: tokens m0_tok + g (and m0_tok + 8 + g)
        tid = _thread_id(tl.zeros([32 * WARPS], dtype=tl.int32))
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        warp = tid // 32
        row_a = pid_n * BN + (warp // KWARPS) * RPW + g
        row_b = row_a + 8
        KW = tl.multiple_of(K // 8, 16 * SPLIT_K * KWARPS * U)
        kws = KW // (SPLIT_K * KWARPS)
        n_groups = K // G
        tok0 = tl.minimum(m0_tok + g, M - 1)  # absent tokens repeat the last one (never stored)
        tok1 = tl.minimum(m0_tok + 8 + g, M - 1)
        qw32 = qw_ptr.to(tl.pointer_type(tl.int32))
        if TILED:  # blocks16 layout (quant.int4): a 1 KB chunk per (16 rows, block), a warp reads 512 B at once
            ra = tl.minimum(row_a, N - 1)
            wa_ptr = qw32 + (ra // 16).to(tl.int64) * KW * 16 + 128 * ((ra // 8) % 2) + 4 * lane
            wb_ptr = wa_ptr + 128
        else:
            wa_ptr = qw32 + tl.minimum(row_a, N - 1).to(tl.int64) * KW + 4 * t  # clamped rows: never stored
            wb_ptr = qw32 + tl.minimum(row_b, N - 1).to(tl.int64) * KW + 4 * t
        x0 = x_ptr + tok0 * stride_xm + 32 * t
        x1 = x_ptr + tok1 * stride_xm + 32 * t
        sa_ptr = tl.minimum(row_a, N - 1) * n_groups
        sb_ptr = tl.minimum(row_b, N - 1) * n_groups
        zero = tl.zeros([32 * WARPS], dtype=tl.float32)
        acc = (zero, zero, zero, zero, zero, zero, zero, zero)
        k_lo = (pid_k * KWARPS + warp % KWARPS) * kws
        k_last = k_lo + kws - 16 * U
        if TRIGGER == 1:
            launch_dependents(PDL)
        if L2_PREFETCH:  # the program's whole weight slice, one bulk request per row (lanes t == 0)
            lead = (t == 0) & (row_a < N)
            prefetch_l2(wa_ptr + k_lo, kws * 4, lead.to(tl.int32))
            if TWO_ROWS:
                prefetch_l2(wb_ptr + k_lo, kws * 4, (lead & (row_b < N)).to(tl.int32))
        # U blocks per step, the next step's weights and scales loaded before this step's math:
        # 16*U bytes per lane and row in flight. Past the slice's end the last step re-reads itself.
        a0, a1, a2, a3, b0, b1, b2, b3 = _load_rows(wa_ptr, wb_ptr, k_lo, TWO_ROWS, LOAD, TILED)
        sc = _load_scales(s_ptr, mn_ptr, sa_ptr, sb_ptr, (k_lo * 8) // G, TWO_ROWS, SHINT)
        c0, c1, c2, c3, f0, f1, f2, f3 = a0, a1, a2, a3, b0, b1, b2, b3
        sc2 = sc
        if U == 2:
            c0, c1, c2, c3, f0, f1, f2, f3 = _load_rows(wa_ptr, wb_ptr, k_lo + 16, TWO_ROWS, LOAD, TILED)
            sc2 = _load_scales(s_ptr, mn_ptr, sa_ptr, sb_ptr, ((k_lo + 16) * 8) // G, TWO_ROWS, SHINT)
        grid_wait(PDL)  # weights only above this line: x, y and the split-K buffers below
        for it in range(0, kws, 16 * U):
            kw0 = k_lo + it
            nxt = tl.minimum(kw0 + 16 * U, k_last)
            n0, n1, n2, n3, m0, m1, m2, m3 = _load_rows(wa_ptr, wb_ptr, nxt, TWO_ROWS, LOAD, TILED)
            sn = _load_scales(s_ptr, mn_ptr, sa_ptr, sb_ptr, (nxt * 8) // G, TWO_ROWS, SHINT)
            if U == 2:
                p0, p1, p2, p3, q0, q1, q2, q3 = _load_rows(wa_ptr, wb_ptr, nxt + 16, TWO_ROWS, LOAD, TILED)
                sn2 = _load_scales(s_ptr, mn_ptr, sa_ptr, sb_ptr, ((nxt + 16) * 8) // G, TWO_ROWS, SHINT)
            acc = _block(ASM, CONSTRAINTS, TWO_ROWS, TILES, OFFSET, a0, a1, a2, a3, b0, b1, b2, b3,
                         x0 + kw0 * 8, x1 + kw0 * 8, sc, acc)
            a0, a1, a2, a3, b0, b1, b2, b3 = n0, n1, n2, n3, m0, m1, m2, m3
            sc = sn
            if U == 2:
                acc = _block(ASM, CONSTRAINTS, TWO_ROWS, TILES, OFFSET, c0, c1, c2, c3, f0, f1, f2, f3,
                             x0 + (kw0 + 16) * 8, x1 + (kw0 + 16) * 8, sc2, acc)
                c0, c1, c2, c3, f0, f1, f2, f3 = p0, p1, p2, p3, q0, q1, q2, q3
                sc2 = sn2
        if TRIGGER == 2:
            launch_dependents(PDL)
        if KWARPS > 1:  # sum each row group's K slices in the CTA; the epilogue runs on [RG * 32]
            p0, p1, p2, p3 = _ksum4(acc[0], acc[1], acc[2], acc[3], RG, KWARPS)
            q0, q1, q2, q3 = p0, p1, p2, p3  # the second token tile's, if any
            if TILES == 2:
                q0, q1, q2, q3 = _ksum4(acc[4], acc[5], acc[6], acc[7], RG, KWARPS)
            acc = (p0, p1, p2, p3, q0, q1, q2, q3)
            r = tl.arange(0, RG * 32)  # element i of the [32 * WARPS] tensors is thread i's
            row_a = pid_n * BN + (r // 32) * RPW + (r % 32) // 4
            row_b = row_a + 8
            t = r % 4
        # element (lane, i): accumulator i -> (token tile, row a/b, token 2t + e)
        e2 = tl.arange(0, 2)[None, :]
        col0 = m0_tok + 2 * t[:, None] + e2
        ra = tl.join(row_a, row_a)
        rb = tl.join(row_b, row_b)
        p_a = tl.join(acc[0], acc[1])
        p_b = tl.join(acc[2], acc[3])
        q_a = tl.join(acc[4], acc[5])
        q_b = tl.join(acc[6], acc[7])
        if TWO_ROWS:
            if TILES == 2:
                out = _cat4(p_a, p_b, q_a, q_b)
                row = _cat4(ra, rb, ra, rb)
                col = _cat4(col0, col0, col0 + 8, col0 + 8)
            else:
                out = _cat2(p_a, p_b)
                row = _cat2(ra, rb)
                col = _cat2(col0, col0)
        else:
            if TILES == 2:
                out = _cat2(p_a, q_a)
                row = _cat2(ra, ra)
                col = _cat2(col0, col0 + 8)
            else:
                out = p_a
                row = ra
                col = col0
        mask = (row < N) & (col < M)
        if HAS_XS:  # activation codes in, real outputs out: one scale per token
            out = out * tl.load(xs_ptr + col, mask=col < M, other=0.0)
        tile = tl.program_id(2) * tl.num_programs(0) + pid_n  # one arrival counter per (token, row) tile
        splitk_finish(out, y_ptr + col * stride_ym + row, ws_ptr, cnt_ptr, col * N + row, mask, tile, pid_k,
                      M * N, SPLIT_K, TAIL)


    @triton.jit
    def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
        return a0 + b0, a1 + b1, a2 + b2, a3 + b3


    @triton.jit
    def _ksum4(v0, v1, v2, v3, RG: tl.constexpr, KWARPS: tl.constexpr):
        """[RG * KWARPS * 32] fp32 each (element i on thread i) -> [RG * 32]: the KWARPS warps of
        each row group summed lane by lane (one reduction, a fixed order: reproducible)."""
        s0, s1, s2, s3 = tl.reduce((tl.reshape(v0, (RG, KWARPS, 32)), tl.reshape(v1, (RG, KWARPS, 32)),
                                    tl.reshape(v2, (RG, KWARPS, 32)), tl.reshape(v3, (RG, KWARPS, 32))), 1, _add4)
        return (tl.reshape(s0, (RG * 32,)), tl.reshape(s1, (RG * 32,)), tl.reshape(s2, (RG * 32,)),
                tl.reshape(s3, (RG * 32,)))


    @triton.jit
    def _cat2(a, b):
        """[R, C] x 2 -> [R, 2C]."""
        return tl.reshape(tl.join(a, b), (a.shape[0], 2 * a.shape[1]))


    @triton.jit
    def _cat4(a, b, c, d):
        return _cat2(_cat2(a, b), _cat2(c, d))


def mma_gemv_supports(store: Int4Weight, cfg: TileConfig, m: int = 1, dtype=torch.bfloat16) -> bool:
    """Groups a multiple of 128 (a block never straddles one), K tiled by the split (and 2-block
    steps), bf16/fp16 activations, and a contiguous 16-byte aligned qweight (the PTX loads 16 B)."""
    k, g = store.in_features, store.group_size
    step = BLOCK_COLS * cfg.split_k * cfg.kwarps * (2 if cfg.prefetch else 1)
    q = store.qweight
    return (1 <= m <= MAX_TOKENS and g % BLOCK_COLS == 0 and k % step == 0 and cfg.warps % cfg.kwarps == 0
            and dtype in (torch.bfloat16, torch.float16)
            and q.is_contiguous() and q.data_ptr() % 16 == 0)


def mma_gemv(x: torch.Tensor, store: Int4Weight, cfg: TileConfig, token_scales: torch.Tensor | None = None,
             out_dtype: torch.dtype | None = None, pdl: bool | None = None,
             l2_prefetch: bool | None = None, trigger: int | None = None, tail: int = 0) -> torch.Tensor:
    """y [M, N] = x [M, K] @ dequant(W).T for 1 <= M <= 16 (cfg: bm = 8 or 16 weight rows per warp,
    warps, split_k over programs, kwarps = warps sharing rows that split K inside the CTA,
    prefetch = 2 blocks per step). With token_scales [M] (fp32), x holds activation
    codes and y = token_scales[:, None] * (x @ dequant(W).T). pdl / l2_prefetch / trigger (defaults:
    `pdl.py`'s switches and `pdl_trigger`) change timing only, never the result; tail != 0 is a
    timing experiment with wrong results (`splitk_finish`)."""
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # (host time: eager decode pays every line)
    m = x2.shape[0]
    if not mma_gemv_supports(store, cfg, m, x2.dtype):
        raise ValueError(f"mma_gemv serves 1..{MAX_TOKENS} bf16/fp16 tokens with groups of a multiple of "
                         f"{BLOCK_COLS}; got M={m}, {x2.dtype}, group {store.group_size}, K={store.in_features}, "
                         f"tile {cfg.key()}")
    if x2.stride(-1) != 1 or (x2.stride(0) * x2.element_size()) % 16 or x2.data_ptr() % 16:
        x2 = x2.contiguous()
    n = store.out_features
    y = torch.empty((m, n), device=x2.device, dtype=out_dtype or x2.dtype)
    two = cfg.bm == 16  # TileConfig.bm: weight rows per warp (8: A rows 8..15 give sum(x); 16: an extra MMA does)
    tiles = 2 if m > 8 else 1  # 9..16 tokens: both token tiles share each A fragment (weights read once)
    bn = (16 if two else 8) * (cfg.warps // cfg.kwarps)
    grid = (cdiv(n, bn), cfg.split_k, cdiv(m, 8 * tiles))
    ws, cnt = splitk_buffers(y, cfg.split_k, m * n, grid[0] * grid[2])
    xs = token_scales if token_scales is not None else y
    dt = "bf16" if x2.dtype == torch.bfloat16 else "f16"
    pdl = pdl_enabled(y) if pdl is None else (pdl and pdl_enabled(y))
    l2_prefetch = l2_prefetch_enabled(y) if l2_prefetch is None else (l2_prefetch and l2_prefetch_enabled(y))
    _mma_gemv_kernel[grid](x2, store.qweight, store.scales, store.mins, y, ws, cnt, xs, m, n, store.in_features,
                           x2.stride(0), y.stride(0), G=store.group_size, WARPS=cfg.warps, SPLIT_K=cfg.split_k,
                           ASM=MMA_ASM[(dt, two, tiles)], CONSTRAINTS=CONSTRAINTS[(two, tiles)], TWO_ROWS=two,
                           TILES=tiles, OFFSET=OFFSET[dt],
                           U=2 if cfg.prefetch else 1, HAS_XS=token_scales is not None, PDL=pdl,
                           L2_PREFETCH=l2_prefetch, TRIGGER=pdl_trigger(m) if trigger is None else trigger,
                           LOAD=WEIGHT_LOADS[WEIGHT_LOAD["name"]], SHINT=WEIGHT_LOAD["scales"], TILED=store.layout == BLOCKS16,
                           num_warps=cfg.warps, num_stages=1, TAIL=tail, KWARPS=cfg.kwarps,
                           **launch_kwargs(pdl))
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], n)


def pdl_trigger(m: int) -> int:
    """Where a PDL launch lets the next kernel in: 1 = at the start, 2 = after the main loop, 0 = at
    exit (benchmarks/pdl.py on the H100: early only pays off for a single token)."""
    return 1 if m == 1 else 2 if m <= 4 else 0


def mma_gemv_quantized(x2: torch.Tensor, store: Int4Weight, act, cfg: TileConfig) -> torch.Tensor:
    """W4A8 / W4A4 / W4A8-fp8 for 1..16 tokens: the activations are quantized per token (Triton),
    their codes stored as exact 16-bit floats and run through the same bf16/fp16 fragments; with
    integer codes every product and per-block sum is an exact integer in fp32, so this computes
    what an int8 MMA would (DPR padding: P_X = (8) padded to 16 bits)."""
    from gearshift.kernels.act_quant import quantize_act_triton

    codes, scales = quantize_act_triton(x2, act, codes_dtype=x2.dtype)
    return mma_gemv(codes, store, cfg, token_scales=scales, out_dtype=x2.dtype)


def mma_config(n: int, k: int, m: int = 1) -> TileConfig:
    """The un-profiled default tile. Up to 8 tokens: 8 warps splitting K inside the CTA, 8 ways for
    N <= 8192 (one 16-row group per CTA) and 4 ways above (two groups), each warp >= 2 blocks: what
    the H100 profile picked for the Llama-3-8B shapes (benchmarks/results/kwarps_*.json). Else
    (9..16 tokens, or K that does not split so): 16 rows per warp, 4 warps, K split over programs
    until there are ~600 of them (at most 8 slices, each >= 2 blocks)."""
    if m <= 8:
        for kw in ((8, 4, 2) if n <= 8192 else (4, 8, 2)):
            if k % (BLOCK_COLS * kw) == 0 and k // (BLOCK_COLS * kw) >= 2:
                return TileConfig(16, 0, BLOCK_COLS, 1, 8, 1, kwarps=kw)
    progs = max(1, -(-n // 64))
    split = 1
    while split < 8 and progs * split < 600 and k % (BLOCK_COLS * split * 2) == 0 and k // (split * 2) >= 256:
        split *= 2
    return TileConfig(16, 0, BLOCK_COLS, split, 4, 1)


def mma_gemv_reference(x: torch.Tensor, store: Int4Weight) -> torch.Tensor:
    return linear_reference(x, store, None)
