"""W4A16 (and W4A8/W4A4 via exact codes) for 1..64 tokens: `mma.sync` fragments built in registers.

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
* 16 rows per warp (`TileConfig.bm`): rows g and g+8 fill A rows 0..15 and a second MMA with
  A = 1.0 gives sum(x); 32 rows per warp: rows g+16 and g+24 form a second A fragment that shares
  each B fragment and the sum MMA, so a lane's activation loads (4x the weight bytes at 16 tokens,
  mostly L2 traffic) serve twice the weights (what the map picks at 9..16 tokens).
* xshare (`TileConfig.xshare`, stop 41): the row groups of a CTA that run the same K slice load
  each block's inputs once into shared memory (double buffered, a named barrier per block) and the
  lanes read their B fragments there, instead of every warp loading its own from L2.
* ksum (`TileConfig.ksum`, stop 42): a kwarps tile's K slices are summed through a static shared
  buffer of the kernel's own, with one barrier and one thread per output, instead of tl.reduce and a
  join/cat epilogue (about ten barriers after the last weight arrives).
Per block and row: y += s * (D - 128 X) + m * X = s * D + (m - 128 s) * X (fp32, scale-after, a
block never straddles a scale group). Split-K over programs with the deterministic one-launch
reduction of `splitk.py`. DPR: P_W = (4) padded to bf16, P_X = (16), bf16 tensor cores.
"""

from __future__ import annotations

import functools

import torch

from gearshift.kernels import residency, switches
from gearshift.kernels._triton import HAS_TRITON, cdiv, tl, triton
from gearshift.kernels.config import TileConfig
from gearshift.kernels.pdl import l2_prefetch_enabled, launch_kwargs, pdl_enabled
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.splitk import splitk_buffers
from gearshift.kernels.x_tiles import (FRAGMENT_ORDER, X_TILE_CHUNK, from_fragment_order, from_x_tiles,  # noqa: F401
                                       tiles_in_fragment_order, to_fragment_order, to_x_tiles, x_tile_rows)

if HAS_TRITON:
    from gearshift.kernels.x_tiles import x_tile_offsets
from gearshift.quant.int4 import BLOCKS16, Int4Weight

BLOCK_COLS = 128  # columns per fragment call: 4 lanes x 4 words x 8 nibbles
#: up to 16 tokens per program (MMA n = 8 tokens per tile, two tiles per lane); 17..64 tokens run
#: 16-token groups as neighbouring programs of each row tile (the later groups read its weights from L2)
MAX_TOKENS = 64


def _kstep_mmas(mma: str, per_lane: int, d: str, e: str, f: str, sums: bool = True) -> list[str]:
    """One k-step's MMAs for one token tile (B in b0, b1): the weight rows into d (and f at 32
    rows), the token sums into e (16 and 32 rows: A = ones; 8 rows: A rows 8..15 are ones, so d
    carries them). sums=False: no token-sum MMA (dequantized weights need none)."""
    if per_lane == 1:
        return [f"{mma} {{{d}}}, {{a0, one, a2, one}}, {{b0, b1}}, {{{d}}};"]
    out = [f"{mma} {{{d}}}, {{a0, a1, a2, a3}}, {{b0, b1}}, {{{d}}};"]
    if per_lane == 4:
        out.append(f"{mma} {{{f}}}, {{c0, c1, c2, c3}}, {{b0, b1}}, {{{f}}};")
    if not sums:
        return out
    return out + [f"{mma} {{{e}}}, {{one, one, one, one}}, {{b0, b1}}, {{{e}}};"]


def _tile_ksteps(mma: str, per_lane: int, tiles: int, bank: int, x_pair, selectors: tuple[str, str] | None,
                 sums: bool = True) -> list[str]:
    """One k-step for every token tile: B gathered from the tile's two input registers x_pair(tile)
    by two PRMTs with `selectors` (None: the two registers are B as they are), then `_kstep_mmas`
    into the accumulators from `bank` on."""
    lines = []
    for tile in range(tiles):
        lo, hi = x_pair(tile)
        d, e, f = (", ".join(f"{r}{bank + 4 * tile + i}" for i in range(4)) for r in "def")
        if selectors is None:
            lines += [f"mov.b32 b0, {lo};", f"mov.b32 b1, {hi};"]  # (register renames: ptxas emits nothing)
        else:
            lines += [f"prmt.b32 b0, {lo}, {hi}, {selectors[0]};", f"prmt.b32 b1, {lo}, {hi}, {selectors[1]};"]
        lines += _kstep_mmas(mma, per_lane, d, e, f, sums)
    return lines


def _block_outputs(per_lane: int, tiles: int) -> list[str]:
    """The PTX registers behind the block's outputs, in operand order (see `_mma_asm`)."""
    outs = []
    for tile in range(tiles):
        o = 4 * tile
        outs += [f"d{o}", f"d{o + 1}", f"d{o + 2}", f"d{o + 3}"]
        if per_lane == 4:
            outs += [f"f{o}", f"f{o + 1}", f"f{o + 2}", f"f{o + 3}"]
        if per_lane >= 2:
            outs += [f"e{o}", f"e{o + 1}"]
    return outs


def _mma_asm(dt: str, magic: int, rows: int, tiles: int = 1, chains: int = 1, fused: bool = True,
             shared: bool = False, x_ahead: int | None = None, fragment_order: bool = False,
             dequant: bool = False, x_step: int = 16) -> str:
    """PTX for one 128-column block of one warp, run once per lane (pack 1).

    rows: weight rows per warp (8, 16 or 32), i.e. 1, 2 or 4 rows per lane (g, g+8, g+16, g+24).
    Inputs: the lane's 4 words of each of its rows, in that order, then one pointer per token tile
    to that tile's token-g inputs for the lane's first word.
    Outputs per token tile, in order: D[a,2t], D[a,2t+1], (D[b,2t], D[b,2t+1], (D[c,2t], D[c,2t+1],
    D[d,2t], D[d,2t+1],)) X[2t], X[2t+1].
    8 rows: A rows 8..15 are 1.0, so D rows 8..15 are X = sum(x) over the block. 16 rows: a second
    MMA with A = 1.0 gives X. 32 rows: two A fragments (rows a/b, c/d) share each B fragment and the
    X MMA, so the lane's activation loads serve twice the weights. Token tiles share the A fragments.
    shared: the inputs come from shared memory (`TileConfig.xshare`), at four 32-bit addresses per token
    tile (the lane's 16-byte chunks of its token row, in word order) instead of one pointer.
    chains > 1 (an ablation, benchmarks/mma_ablations/chains.py: no faster on the H100): the
    block's MMAs alternate between that many accumulator sets, summed at the end.
    x_ahead (an ablation, step_ladder.py's `x ahead N`; same bits): each word's inputs are loaded that
    many words ahead of their k-steps instead of all at the block's top (fewer live input registers).
    fragment_order: the inputs are stored in fragment order (`to_fragment_order`: columns 0, 4, 1, 5, 2, 6,
    3, 7 of every 8), so each input register already is a B operand and the 16 PRMTs per token tile and
    block go; the same MMAs on the same operands, so the same bits (stop 52; the engine's x tiles, stop 65).
    dequant: groups of 32 or 64 columns (GGUF Q4_0 / Q4_1), which the scale-after fold cannot serve, since
    every k-step mixes the 32-column runs of the four lanes t (one group each at group 32). Each pair is
    dequantized before its MMA instead: (128 + q) - 128 = q exactly, then one `fma.rn` with the row's scale
    and min of the lane's group (bf16x2 / f16x2 operands after the pointers, scale then min per row), so
    each weight is rounded once to the activation dtype, and no token-sum MMA is needed (two more
    instructions per weight pair, one fewer MMA per k-step at 16 and 32 rows); the outputs' X values are 0
    (8 rows: rows 8..15 are still sums, unused).
    x_step: bytes from one of a lane's 16-byte input chunks to its next (16: its token row's 64 bytes in
    order; 512: `to_x_tiles`' layout, where each chunk load of the warp reads 512 contiguous bytes).
    """
    per_lane = rows // 8
    mm = f"0x{magic:04X}{magic:04X}"
    one = "0x3F803F80" if dt == "bf16" else "0x3C003C00"
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{dt}.{dt}.f32"
    n_out = {1: 4, 2: 6, 4: 10}[per_lane] * tiles
    w0 = [n_out + 4 * r for r in range(per_lane)]  # first operand of each row's words
    xp0 = n_out + 4 * per_lane
    banks = "def" if per_lane == 4 else "de"
    n_acc = 4 * tiles * chains
    sp0 = xp0 + (4 * tiles if shared else tiles)  # dequant: the rows' (scale, min) pairs
    neg = "0xC300C300" if dt == "bf16" else "0xE400E400"  # -128 / -1024: the magic's offset
    lines = ["{", ".reg .b32 a0, a1, a2, a3, one, mg, b0, b1, t;" + (" .reg .b32 c0, c1, c2, c3;" if per_lane == 4 else "")
             + (" .reg .b32 nm;" if dequant else ""),
             f".reg .b32 x<{16 * tiles}>;",
             ".reg .f32 " + ", ".join(f"{r}<{n_acc}>" for r in banks) + ";",
             f"mov.b32 one, {one};", f"mov.b32 mg, {mm};"] + ([f"mov.b32 nm, {neg};"] if dequant else [])
    lines += [f"mov.f32 {r}{i}, 0f00000000;" for r in banks for i in range(n_acc)]

    def pair(reg: str, word: str, shift: int, row: int = 0) -> None:
        src = word
        if shift:
            lines.append(f"shr.b32 t, {word}, {shift};")
            src = "t"
        # (src & 0x000F000F) | magic as one LOP3 (0xEA = a & b | c): SASS LOP3 takes one immediate,
        # so the magic rides in a register; and + or as two PTX ops compile to two LOP3s (stop 33:
        # 182 -> 149 SASS instructions per block in the one-token gate_up tile's loop)
        if fused:
            lines.append(f"lop3.b32 {reg}, {src}, 0x000F000F, mg, 0xEA;")
        else:
            lines.append(f"and.b32 {reg}, {src}, 0x000F000F;")
            lines.append(f"or.b32 {reg}, {reg}, {mm};")
        if dequant:  # q exactly, then s * q + m rounded once
            lines.append(f"fma.rn.{dt}x2 {reg}, {reg}, one, nm;")
            lines.append(f"fma.rn.{dt}x2 {reg}, {reg}, ${sp0 + 2 * row}, ${sp0 + 2 * row + 1};")

    def load_x(tile: int, j: int) -> None:
        x = [f"x{16 * tile + 4 * j + i}" for i in range(4)]
        if shared:
            lines.append(f"ld.shared.v4.b32 {{{', '.join(x)}}}, [${xp0 + 4 * tile + j}];")
        else:
            lines.append(f"ld.global.v4.b32 {{{', '.join(x)}}}, [${xp0 + tile}+{x_step * j}];")

    if x_ahead is None:  # all of the block's inputs first: one L1 round trip
        for tile in range(tiles):
            for j in range(4):
                load_x(tile, j)
    else:
        for j in range(min(x_ahead, 4)):
            for tile in range(tiles):
                load_x(tile, j)
    for j in range(4):
        if x_ahead is not None and j + x_ahead < 4:
            for tile in range(tiles):
                load_x(tile, j + x_ahead)
        for half in range(2):
            pair("a0", f"${w0[0] + j}", 8 * half)
            pair("a2", f"${w0[0] + j}", 8 * half + 4)
            if per_lane >= 2:
                pair("a1", f"${w0[1] + j}", 8 * half, 1)
                pair("a3", f"${w0[1] + j}", 8 * half + 4, 1)
            if per_lane == 4:
                pair("c0", f"${w0[2] + j}", 8 * half, 2)
                pair("c2", f"${w0[2] + j}", 8 * half + 4, 2)
                pair("c1", f"${w0[3] + j}", 8 * half, 3)
                pair("c3", f"${w0[3] + j}", 8 * half + 4, 3)
            if fragment_order:  # word 4j + 2 half holds columns (c, c + 4), the next one (c + 1, c + 5)
                x_pair = lambda tile: (f"x{16 * tile + 4 * j + 2 * half}", f"x{16 * tile + 4 * j + 2 * half + 1}")  # noqa: E731
            else:
                x_pair = lambda tile: (f"x{16 * tile + 4 * j + half}", f"x{16 * tile + 4 * j + half + 2}")  # noqa: E731
            lines += _tile_ksteps(mma, per_lane, tiles, 4 * tiles * ((2 * j + half) % chains), x_pair,
                                  None if fragment_order else ("0x5410", "0x7632"), sums=not dequant)
    for c in range(1, chains):
        lines += [f"add.f32 {r}{i}, {r}{i}, {r}{4 * tiles * c + i};" for r in banks for i in range(4 * tiles)]
    lines += [f"mov.b32 ${i}, {v};" for i, v in enumerate(_block_outputs(per_lane, tiles))]
    lines.append("}")
    return "\n".join(lines)


def _mma_asm_s8(rows: int, tiles: int = 1, shared: bool = False, x_step: int = 16,
                fragment_order: bool = False) -> str:
    """PTX for one 128-column block on int8 activation codes (W4A8 / W4A4): `mma.m16n8k32` s8.

    Same operands and outputs as `_mma_asm` (the outputs as fp32), but a nibble becomes an int8 in
    place: w & 0x0F0F0F0F holds the word's even columns 0, 2, 4, 6 as four bytes and (w >> 4) &
    0x0F0F0F0F the odd ones (three instructions per word for 8 weights, against seven for bf16
    pairs). Word j of the lane is k-step j: A = (even | odd) x (rows), B = the token's codes at the
    same columns, gathered from its 8-byte run by two PRMTs. The products and per-block sums are
    exact int32 (|x| <= 127, q <= 15), converted to fp32 once per block; no +128 offset. A lane
    reads 32 bytes of each token per block, half of the 16-bit codes' traffic, and runs half the MMAs.
    shared: the codes come from shared memory at two 32-bit addresses per token tile (`TileConfig.xshare`).
    x_step: as in `_mma_asm` (512: `to_x_tiles`' layout).
    fragment_order: the codes are stored in `S8_FRAGMENT_ORDER` (each 8-byte run's even columns, then its odd
    ones), so each input register already is a B operand and the 8 PRMTs per token tile and block go (stop 69).
    """
    per_lane = rows // 8
    mma = "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"
    n_out = {1: 4, 2: 6, 4: 10}[per_lane] * tiles
    w0 = [n_out + 4 * r for r in range(per_lane)]
    xp0 = n_out + 4 * per_lane
    banks = "def" if per_lane == 4 else "de"
    lines = ["{", ".reg .b32 a0, a1, a2, a3, one, b0, b1, t;" + (" .reg .b32 c0, c1, c2, c3;" if per_lane == 4 else ""),
             f".reg .b32 x<{8 * tiles}>;", ".reg .s32 " + ", ".join(f"{r}<{4 * tiles}>" for r in banks) + ";",
             ".reg .f32 cv;", "mov.b32 one, 0x01010101;"]
    lines += [f"mov.s32 {r}{i}, 0;" for r in banks for i in range(4 * tiles)]
    for tile in range(tiles):
        for j in range(2):
            x = [f"x{8 * tile + 4 * j + i}" for i in range(4)]
            if shared:
                lines.append(f"ld.shared.v4.b32 {{{', '.join(x)}}}, [${xp0 + 2 * tile + j}];")
            else:
                lines.append(f"ld.global.v4.b32 {{{', '.join(x)}}}, [${xp0 + tile}+{x_step * j}];")

    def split(even: str, odd: str, word: str) -> None:
        lines.extend([f"and.b32 {even}, {word}, 0x0F0F0F0F;", f"shr.b32 t, {word}, 4;",
                      f"and.b32 {odd}, t, 0x0F0F0F0F;"])

    for j in range(4):
        split("a0", "a2", f"${w0[0] + j}")
        if per_lane >= 2:
            split("a1", "a3", f"${w0[1] + j}")
        if per_lane == 4:
            split("c0", "c2", f"${w0[2] + j}")
            split("c1", "c3", f"${w0[3] + j}")
        lines += _tile_ksteps(mma, per_lane, tiles, 0,
                              lambda tile: (f"x{8 * tile + 2 * j}", f"x{8 * tile + 2 * j + 1}"),
                              None if fragment_order else ("0x6420", "0x7531"))
    for i, v in enumerate(_block_outputs(per_lane, tiles)):
        lines += [f"cvt.rn.f32.s32 cv, {v};", f"mov.b32 ${i}, cv;"]
    lines.append("}")
    return "\n".join(lines)


ROWS_PER_WARP = (8, 16, 32)  # TileConfig.bm of the fragment kernel: 1, 2 or 4 weight rows per lane
MMA_ASM = {(dt, rows, tiles): _mma_asm(dt, magic, rows, tiles) for dt, magic in (("bf16", 0x4300), ("f16", 0x6400))
           for rows in ROWS_PER_WARP for tiles in (1, 2)}
#: the same with AND + OR per nibble pair (before stop 33; `FUSED_LOP3 = False` runs it: same bits)
MMA_ASM_ANDOR = {(dt, rows, tiles): _mma_asm(dt, magic, rows, tiles, fused=False)
                 for dt, magic in (("bf16", 0x4300), ("f16", 0x6400)) for rows in ROWS_PER_WARP for tiles in (1, 2)}
FUSED_LOP3 = True
#: activations from shared memory (`TileConfig.xshare`)
MMA_ASM_SHARED = {(dt, rows, tiles): _mma_asm(dt, magic, rows, tiles, shared=True)
                  for dt, magic in (("bf16", 0x4300), ("f16", 0x6400)) for rows in ROWS_PER_WARP for tiles in (1, 2)}
#: inputs in fragment order (`to_fragment_order`), from global or shared memory: keyed (dt, rows, tiles, shared)
MMA_ASM_FRAGMENT = {(dt, rows, tiles, shared): _mma_asm(dt, magic, rows, tiles, shared=shared, fragment_order=True)
                    for dt, magic in (("bf16", 0x4300), ("f16", 0x6400)) for rows in ROWS_PER_WARP for tiles in (1, 2)
                    for shared in (False, True)}
#: groups of 32 / 64 columns: weights dequantized before the MMA (`_mma_asm`'s dequant), keyed (dt, rows, tiles, shared)
MMA_ASM_DQ = {(dt, rows, tiles, shared): _mma_asm(dt, magic, rows, tiles, shared=shared, dequant=True)
              for dt, magic in (("bf16", 0x4300), ("f16", 0x6400)) for rows in ROWS_PER_WARP for tiles in (1, 2)
              for shared in (False, True)}
#: int8 activation codes: `_mma_asm_s8`
MMA_ASM_S8 = {(rows, tiles): _mma_asm_s8(rows, tiles) for rows in ROWS_PER_WARP for tiles in (1, 2)}
MMA_ASM_S8_SHARED = {(rows, tiles): _mma_asm_s8(rows, tiles, shared=True) for rows in ROWS_PER_WARP for tiles in (1, 2)}
#: int8 codes in `S8_FRAGMENT_ORDER`, from global or shared memory: keyed (rows, tiles, shared)
MMA_ASM_S8_FRAGMENT = {(rows, tiles, shared): _mma_asm_s8(rows, tiles, shared=shared, fragment_order=True)
                       for rows in ROWS_PER_WARP for tiles in (1, 2) for shared in (False, True)}
OFFSET = {"bf16": 128.0, "f16": 1024.0, "s8": 0.0}
# PTX of the weight loads (16 bytes per lane and row, read once: no L1 allocation). The L2 prefetch-size
# forms make the row's next blocks L2 hits; benchmarks/mma_ablations/loads.py times them.
WEIGHT_LOADS = {
    "plain": "ld.global.nc.L1::no_allocate.v4.b32 {$0, $1, $2, $3}, [$4];",
    "l2_128": "ld.global.nc.L1::no_allocate.L2::128B.v4.b32 {$0, $1, $2, $3}, [$4];",
    "l2_256": "ld.global.nc.L1::no_allocate.L2::256B.v4.b32 {$0, $1, $2, $3}, [$4];",
}
PRELOAD_REGISTERS = 128  # TileConfig.preload: weight registers per lane (16 blocks at 16 rows per warp)
TRIGGER = -1  # >= 0: overrides pdl_trigger(m) for every launch (timing experiments; results never change;
# 3 = right after the PDL wait: at most one successor preloads while this kernel streams)
L2_AHEAD = 0  # > 0: stepped tiles also bulk-prefetch into L2 this many steps beyond their register prefetch
# (a timing experiment, stop 31; results never change)
#: W4A16 launches of one token group (1..16 tokens) take their token offset from program_id(2), the
#: form its map entries were profiled with: stop 34's neighbour form for every launch made ptxas
#: allocate otherwise and the whole W4A16 step 1.09x / 1.09x / 1.04x / 1.01x / 1.01x as long at M =
#: 1 / 2 / 4 / 8 / 16 (stop 35, policy_ab --set-a int4_mma_gemv.ONE_GROUP_Z=0). Code launches (W4A8 /
#: W4A4 / fp8), whose entries were re-profiled on the neighbour form, measured 0.995-1.027 with it and
#: keep the neighbour form. 0: the neighbour form everywhere (same results)
ONE_GROUP_Z = 1
#: > 0: every launch asks for the shared memory that lets at most this many of its CTAs share an SM
#: (`residency.py`; a timing experiment, results never change)
RESIDENCY = 0
#: a list: every launch (split_k 1 only) also records, per program, %globaltimer at its start and its
#: end (and, with TRACE_WAIT, after its PDL wait), and its %smid, in rows of TRACE_ARENA, and appends
#: those rows with the launch's shape here (`benchmarks/mma_ablations/chain_trace.py`; a timing
#: experiment, results never change)
TRACE: list | None = None
TRACE_ARENA: torch.Tensor | None = None  # int64 [rows, 4] that TRACE's launches take their rows from, in order
#: TRACE also records the time after the PDL wait (field 1; else it is left unset): that store changes
#: ptxas's allocation of some tiles (the one-token qkv tile: 110 registers instead of 78)
TRACE_WAIT = False
# scales 1: the scale/min loads with an L2 prefetch size too; 2: none (timing ablation, wrong results)
WEIGHT_LOAD = {"name": "plain", "scales": 0}
#: 1 / 0: the scale group index divided signed / unsigned in every launch; -1: `switches.group_signed`'s choice
#: (a timing ablation: results never change)
GROUP_SIGNED = -1
CONSTRAINTS = {(rows, tiles): ",".join(["=r"] * ({8: 4, 16: 6, 32: 10}[rows] * tiles) + ["r"] * (rows // 2)
                                       + ["l"] * tiles) for rows in ROWS_PER_WARP for tiles in (1, 2)}
XS_GLOBAL_LOAD = "ld.global.v4.b32 {$0, $1, $2, $3}, [$4];"  # an xshare block's inputs (written by the
# previous kernel, so not .nc)
CONSTRAINTS_SHARED = {(rows, tiles): ",".join(["=r"] * ({8: 4, 16: 6, 32: 10}[rows] * tiles) + ["r"] * (rows // 2)
                                              + ["r"] * (4 * tiles)) for rows in ROWS_PER_WARP for tiles in (1, 2)}
CONSTRAINTS_SHARED_S8 = {(rows, tiles): ",".join(["=r"] * ({8: 4, 16: 6, 32: 10}[rows] * tiles) + ["r"] * (rows // 2)
                                                 + ["r"] * (2 * tiles)) for rows in ROWS_PER_WARP for tiles in (1, 2)}
#: TileConfig.xshare: one block's inputs for the tokens of a program (16 or 8 tokens x 256 bytes of bf16 /
#: fp16, or 128 of int8 codes), twice (double buffered) per K slice of the CTA; static shared memory, so at
#: most 48 KB


def xshare_bytes(tiles: int, kwarps: int, row_bytes: int = 2 * BLOCK_COLS) -> int:
    """Shared memory of an xshare launch: two block buffers per K slice of the CTA."""
    return 2 * 8 * tiles * row_bytes * kwarps


KSUM_PAD = 33  # words per (warp, value) row of the K-sum buffer: 32 lanes + 1, so the summing reads spread over banks


def ksum_values(rows: int, tiles: int) -> int:
    """Accumulators per lane that hold outputs: rows a (and b, c, d) x tokens 2t, 2t+1, per token tile."""
    return 2 * (rows // 8) * tiles


def ksum_bytes(rows: int, tiles: int, warps: int) -> int:
    """Static shared memory of the K-sum epilogue: every warp's output-holding accumulators."""
    return 4 * KSUM_PAD * ksum_values(rows, tiles) * warps


def static_smem_decl(name: str, nbytes: int, align: int) -> str:
    """PTX that declares a static shared-memory buffer of the kernel's own and returns its address
    (Triton allocates shared memory only for its own layouts; `_xs_base` runs it)."""
    return f"{{ .shared .align {align} .b8 {name}[{nbytes}]; mov.u32 $0, {name}; }}"


def ksum_decl(nbytes: int) -> str:
    """The K-sum buffer's declaration."""
    return static_smem_decl("gs_ksum", nbytes, 16)


def _ksum_store_asm(nv: int) -> str:
    stores = " ".join(f"st.shared.f32 [$1+{4 * KSUM_PAD * i}], ${i + 2};" for i in range(nv))
    return stores + " mov.u32 $0, 0;"


def _ksum_load_asm(kwarps: int, nv: int) -> str:
    """Sums one output's KWARPS partials in slice order (add.rn: no contraction, reproducible)."""
    step = 4 * KSUM_PAD * nv
    regs = ", ".join(f"v{i}" for i in range(kwarps))
    loads = " ".join(f"ld.shared.f32 v{i}, [$1+{step * i}];" for i in range(kwarps))
    adds = "mov.f32 $0, v0; " + " ".join(f"add.rn.f32 $0, $0, v{i};" for i in range(1, kwarps))
    return f"{{ .reg .f32 {regs}; {loads} {adds} }}"


KSUM_STORE_ASM = {nv: _ksum_store_asm(nv) for nv in (2, 4, 8, 16)}
KSUM_STORE_CONSTRAINTS = {nv: ",".join(["=r", "r"] + ["f"] * nv) for nv in (2, 4, 8, 16)}
KSUM_LOAD_ASM = {(kw, nv): _ksum_load_asm(kw, nv) for kw in (2, 4, 8, 16) for nv in (2, 4, 8, 16)}


def _xshare_decl(nbytes: int) -> str:
    """The xshare buffers' declaration."""
    return static_smem_decl("gs_xshare", nbytes, 128)

if HAS_TRITON:
    from gearshift.kernels.pdl import grid_wait, launch_dependents, prefetch_l2
    from gearshift.kernels.silu_mul import _silu_mul
    from gearshift.kernels.splitk import splitk_finish

    _XS_LOAD = tl.constexpr(XS_GLOBAL_LOAD)
    _KSUM_PAD = tl.constexpr(KSUM_PAD)

    @triton.jit
    def _thread_id(like):
        """%tid.x of the thread holding each element (not pure: never rematerialized elsewhere)."""
        return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r,r", [like], dtype=tl.int32, is_pure=False,
                                         pack=1)


    @triton.jit
    def _trace(ws_ptr, like, FIELD: tl.constexpr):
        """Thread 0 writes %globaltimer (ns) into field FIELD (0 start, 1 after the PDL wait, 2 end; the end
        also writes %smid into field 3) of its program's int64 row of 4 at ws_ptr, at once, so that no
        value stays live across the kernel (TRACE: a timing experiment; the rows are the launch's own
        buffer, which no other kernel touches, so the store before the PDL wait is safe)."""
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [like], dtype=tl.int64, is_pure=False,
                                      pack=1)
        p = (tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2)))
        row = ws_ptr.to(tl.pointer_type(tl.int64)) + 4 * p.to(tl.int64) + like * 0
        tl.store(row + FIELD, t, mask=like == 0)
        if FIELD == 2:
            sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [like], dtype=tl.int32, is_pure=False,
                                           pack=1)
            tl.store(row + 3, sm.to(tl.int64), mask=like == 0)


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
    def _load_scales(s_ptr, mn_ptr, offs, g, ROWS: tl.constexpr, HINT: tl.constexpr):
        """(scale, min) of each of the lane's rows at group g: 8 values (absent rows repeat row a / b).
        HINT 2: no loads, scale 1 and min 0 everywhere (a timing ablation: wrong results)."""
        if HINT == 2:
            one = (offs[0] * 0 + 1).to(s_ptr.dtype.element_ty)
            zero = (offs[0] * 0).to(mn_ptr.dtype.element_ty)
            return one, zero, one, zero, one, zero, one, zero
        sa = _load_half(s_ptr + offs[0] + g, HINT)
        ma = _load_half(mn_ptr + offs[0] + g, HINT)
        if ROWS == 8:
            return sa, ma, sa, ma, sa, ma, sa, ma
        sb = _load_half(s_ptr + offs[1] + g, HINT)
        mb = _load_half(mn_ptr + offs[1] + g, HINT)
        if ROWS == 16:
            return sa, ma, sb, mb, sa, ma, sb, mb
        return (sa, ma, sb, mb, _load_half(s_ptr + offs[2] + g, HINT), _load_half(mn_ptr + offs[2] + g, HINT),
                _load_half(s_ptr + offs[3] + g, HINT), _load_half(mn_ptr + offs[3] + g, HINT))


    @triton.jit
    def _load_rows(w_ptrs, kw, ROWS: tl.constexpr, LOAD: tl.constexpr, TILED: tl.constexpr):
        """The lane's 4 words of each of its rows at word kw: 16 values (absent rows repeat a / b)."""
        if TILED:
            kw = kw * 16  # 16 words of a row per block -> 256 words of the 16-row chunk
        a0, a1, a2, a3 = _load16(w_ptrs[0] + kw, LOAD)
        if ROWS == 8:
            return a0, a1, a2, a3, a0, a1, a2, a3, a0, a1, a2, a3, a0, a1, a2, a3
        b0, b1, b2, b3 = _load16(w_ptrs[1] + kw, LOAD)
        if ROWS == 16:
            return a0, a1, a2, a3, b0, b1, b2, b3, a0, a1, a2, a3, b0, b1, b2, b3
        c0, c1, c2, c3 = _load16(w_ptrs[2] + kw, LOAD)
        d0, d1, d2, d3 = _load16(w_ptrs[3] + kw, LOAD)
        return a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3


    @triton.jit
    def _group_of(kw, G: tl.constexpr, GS: tl.constexpr):
        """The scale group of int32 word kw (8 columns a word). GS 0: divided unsigned (kw >= 0), without the
        signed division's fix-up in every block; which is faster depends on the tile (`switches.group_signed`)."""
        if GS:
            return (kw * 8) // G
        return (kw.to(tl.uint32) // (G // 8)).to(tl.int32)


    @triton.jit
    def _load_step(w_ptrs, s_ptr, mn_ptr, s_offs, kw, G: tl.constexpr, ROWS: tl.constexpr, LOAD: tl.constexpr,
                   TILED: tl.constexpr, SHINT: tl.constexpr, U: tl.constexpr, GS: tl.constexpr):
        """Weights and scales of the U blocks from word kw: (w, sc, w2, sc2), the second pair
        repeating the first when U == 1."""
        w = _load_rows(w_ptrs, kw, ROWS, LOAD, TILED)
        sc = _load_scales(s_ptr, mn_ptr, s_offs, _group_of(kw, G, GS), ROWS, SHINT)
        w2 = w
        sc2 = sc
        if U == 2:
            w2 = _load_rows(w_ptrs, kw + 16, ROWS, LOAD, TILED)
            sc2 = _load_scales(s_ptr, mn_ptr, s_offs, _group_of(kw + 16, G, GS), ROWS, SHINT)
        return w, sc, w2, sc2


    @triton.jit
    def _prefetch_blocks(qw32, ra, rc, KW, kw, nwords, lane, t, row_a, N, ROWS: tl.constexpr, TILED: tl.constexpr):
        """Bulk L2 prefetch of the lane's rows' weights from word kw on, nwords words per row (0:
        nothing). blocks16: a 16-row group's blocks are consecutive 1 KB chunks, so lane 0 of the
        warp asks for the whole range of its group (and of the second group at 32 rows); rows:
        lanes t == 0 ask for their rows' own ranges."""
        if TILED:
            lead = ((lane == 0) & (row_a < N) & (nwords > 0)).to(tl.int32)
            prefetch_l2(qw32 + (ra // 16).to(tl.int64) * KW * 16 + kw * 16, nwords * 64, lead)
            if ROWS == 32:
                prefetch_l2(qw32 + (rc // 16).to(tl.int64) * KW * 16 + kw * 16, nwords * 64,
                            lead & (row_a + 16 < N).to(tl.int32))
        else:
            lead = ((t == 0) & (row_a < N) & (nwords > 0)).to(tl.int32)
            for r in tl.static_range(ROWS // 8):
                prefetch_l2(qw32 + tl.minimum(ra + 8 * r, N - 1).to(tl.int64) * KW + kw, nwords * 4,
                            lead & (row_a + 8 * r < N).to(tl.int32))


    @triton.jit
    def _fold(d0, d1, e0, e1, sa, ma, acc0, acc1, DQ: tl.constexpr = 0):
        """Scale-after; DQ (dequantize-first blocks): the block's dot products as they are."""
        if DQ:
            return acc0 + d0, acc1 + d1
        return acc0 + sa * d0 + ma * e0, acc1 + sa * d1 + ma * e1


    @triton.jit
    def _xs_base(like, DECL: tl.constexpr):
        """The address of a static shared-memory buffer declared by DECL (`_xshare_decl`, `ksum_decl`)."""
        return tl.inline_asm_elementwise(DECL, "=r,r", [like], dtype=tl.int32, is_pure=False, pack=1)


    @triton.jit
    def _ksum_store(buf, acc, ROWS: tl.constexpr, TILES: tl.constexpr, ST: tl.constexpr, STC: tl.constexpr):
        """This lane's output-holding accumulators into its warp's rows of the K-sum buffer (buf: the
        lane's word in value row 0); value s = 2 (tile * ROWS / 8 + r) + e is acc[8 tile + 2 r + e].
        Returns 0 (the barrier takes it, so that it follows the stores)."""
        if ROWS == 8:
            if TILES == 1:
                v = [buf, acc[0], acc[1]]
            else:
                v = [buf, acc[0], acc[1], acc[8], acc[9]]
        elif ROWS == 16:
            if TILES == 1:
                v = [buf, acc[0], acc[1], acc[2], acc[3]]
            else:
                v = [buf, acc[0], acc[1], acc[2], acc[3], acc[8], acc[9], acc[10], acc[11]]
        else:
            if TILES == 1:
                v = [buf, acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]]
            else:
                v = [buf, acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
                     acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15]]
        return tl.inline_asm_elementwise(ST, STC, v, dtype=tl.int32, is_pure=False, pack=1)


    @triton.jit
    def _cta_sync(after):
        """bar.sync 0 (every thread of the CTA), after the value `after`; returns 0 for the reads
        that must follow it to add to their addresses."""
        return tl.inline_asm_elementwise("bar.sync 0; mov.u32 $0, 0;", "=r,r", [after], dtype=tl.int32,
                                         is_pure=False, pack=1)


    @triton.jit
    def _ksum_pass(buf, c0, tid, pid_n, m0_tok, xs_ptr, y_ptr, M, N, stride_ym, ROWS: tl.constexpr,
                   TILES: tl.constexpr, RG: tl.constexpr, KWARPS: tl.constexpr, NV: tl.constexpr,
                   LD: tl.constexpr, HAS_XS: tl.constexpr):
        """Outputs (token column c0 + tid // (RG ROWS), row tid % (RG ROWS)) of the program: one thread
        each sums its KWARPS partials in slice order and stores the result (consecutive threads,
        consecutive rows)."""
        rl = tid % (RG * ROWS)
        c = c0 + tid // (RG * ROWS)  # token column within the program's 8 * TILES
        cl = tl.minimum(c, 8 * TILES - 1)  # (idle threads read a valid word)
        rr = rl % ROWS
        s = ((cl // 8) * (ROWS // 8) + rr // 8) * 2 + cl % 2
        src = ((rl // ROWS) * KWARPS * NV + s) * _KSUM_PAD + 4 * (rr % 8) + (cl % 8) // 2
        tot = tl.inline_asm_elementwise(LD, "=f,r", [buf + 4 * src], dtype=tl.float32, is_pure=False, pack=1)
        row = pid_n * (RG * ROWS) + rl
        col = m0_tok + c
        mask = (row < N) & (col < M) & (c < 8 * TILES)
        if HAS_XS:  # activation codes in, real outputs out: one scale per token
            tot = tot * tl.load(xs_ptr + col, mask=mask, other=0.0)
        tl.store(y_ptr + col * stride_ym + row, tot.to(y_ptr.dtype.element_ty), mask=mask)


    @triton.jit
    def _xs_sync(bar, nthreads):
        """bar.sync of the warps that share one K slice. Returns 0, which the reads after it add to
        their addresses so that none is scheduled before it."""
        return tl.inline_asm_elementwise("bar.sync $1, $2; mov.u32 $0, 0;", "=r,r,r", [bar, nthreads], dtype=tl.int32,
                                         is_pure=False, pack=1)


    @triton.jit
    def _xs_chunk(buf, token, c, ROWB: tl.constexpr):
        """Shared address of 16-byte chunk c of token row `token` (ROWB bytes: a block's 128 inputs,
        256 bf16 / fp16 bytes or 128 int8 codes) in an xshare buffer. Chunks are stored at
        c ^ 2 (c >> 3) ^ (token & 1): the fragment reads (`_xs_lane`) and the row stores then fall in 8
        distinct 16-byte bank groups per quarter warp."""
        return buf + token * ROWB + 16 * (c ^ (2 * (c // 8)) ^ (token % 2))


    @triton.jit
    def _xs_lane(buf, g, t, j, ROWB: tl.constexpr):
        """Where lane (g, t) reads chunk j of its inputs in an xshare buffer: its 32 columns are chunks
        (ROWB / 64) t .. (ROWB / 64) (t + 1) - 1 of token row g."""
        return _xs_chunk(buf, g, (ROWB // 64) * t + j, ROWB)


    @triton.jit
    def _xs_fetch(xi32, srow, m0_tok, M, kw, q, NT: tl.constexpr, NCH: tl.constexpr, ROWB: tl.constexpr):
        """This lane's share of one block's inputs (NCH 16-byte chunks of the program's token rows,
        chunk q + j * NT; srow: a row's stride in int32 words): a tuple of NCH 4-word tuples."""
        out = ()
        for j in tl.static_range(NCH):
            ch = q + j * NT
            tok = tl.minimum(m0_tok + ch // (ROWB // 16), M - 1)  # absent tokens repeat the last one
            out = out + (_load16(xi32 + tok * srow + kw * (ROWB // 64) + 4 * (ch % (ROWB // 16)), _XS_LOAD),)
        return out


    @triton.jit
    def _xs_store(buf, chunks, q, NT: tl.constexpr, NCH: tl.constexpr, after, ROWB: tl.constexpr):
        """Stores `_xs_fetch`'s chunks into buffer buf (after: a value the stores must follow)."""
        for j in tl.static_range(NCH):
            ch = q + j * NT
            v = chunks[j]
            tl.inline_asm_elementwise("st.shared.v4.b32 [$1], {$2, $3, $4, $5}; mov.u32 $0, 0;", "=r,r,r,r,r,r",
                                      [_xs_chunk(buf, ch // (ROWB // 16), ch % (ROWB // 16), ROWB) + after, v[0], v[1],
                                       v[2], v[3]], dtype=tl.int32, is_pure=False, pack=1)


    @triton.jit
    def _xs_first(xi32, srow, m0_tok, M, kw, q, buf, NT: tl.constexpr, NCH: tl.constexpr, ROWB: tl.constexpr):
        """The slice's first block into buffer 0 (before an xshare loop)."""
        _xs_store(buf, _xs_fetch(xi32, srow, m0_tok, M, kw, q, NT, NCH, ROWB), q, NT, NCH, 0, ROWB)


    @triton.jit
    def _xs_step(ASM: tl.constexpr, CONSTRAINTS: tl.constexpr, ROWS: tl.constexpr, TILES: tl.constexpr,
                 OFFSET: tl.constexpr, w, sc, acc, xi32, srow, m0_tok, M, kw_next, q, buf0, g, t, par, bar,
                 NT: tl.constexpr, NCH: tl.constexpr, BUFB: tl.constexpr, ROWB: tl.constexpr, DQ: tl.constexpr = 0):
        """One block of an xshare loop: the next block's inputs fetched into registers, the slice's
        barrier (buffer par is complete, buffer 1 - par is no longer read), this block's fragments read
        from buffer par, then the next block's inputs stored into buffer 1 - par."""
        xn = _xs_fetch(xi32, srow, m0_tok, M, kw_next, q, NT, NCH, ROWB)
        z = _xs_sync(bar, NT)
        b = buf0 + par * BUFB + z
        xa = ()
        xb = ()
        for j in tl.static_range(ROWB // 64):
            xa = xa + (_xs_lane(b, g, t, j, ROWB),)
            xb = xb + (_xs_lane(b, g + 8, t, j, ROWB),)
        acc = _block(ASM, CONSTRAINTS, ROWS, TILES, OFFSET, w, xa, xb, sc, acc, 1, DQ)
        _xs_store(buf0 + (1 - par) * BUFB, xn, q, NT, NCH, z, ROWB)
        return acc


    @triton.jit
    def _pack2(v, DQ: tl.constexpr):
        """A scale or min as both halves of a bf16x2 (DQ 1) or f16x2 (DQ 2) register."""
        if DQ == 1:
            h = v.to(tl.bfloat16).to(tl.int16, bitcast=True)
        else:
            h = v.to(tl.float16).to(tl.int16, bitcast=True)
        b = h.to(tl.int32) & 0xFFFF
        return b | (b << 16)


    @triton.jit
    def _dq_scales(sc, ROWS: tl.constexpr, DQ: tl.constexpr):
        """The packed (scale, min) operands of a dequantize-first block, per lane row."""
        out = (_pack2(sc[0], DQ), _pack2(sc[1], DQ))
        if ROWS >= 16:
            out = out + (_pack2(sc[2], DQ), _pack2(sc[3], DQ))
        if ROWS == 32:
            out = out + (_pack2(sc[4], DQ), _pack2(sc[5], DQ), _pack2(sc[6], DQ), _pack2(sc[7], DQ))
        return out


    @triton.jit
    def _block(ASM: tl.constexpr, CONSTRAINTS: tl.constexpr, ROWS: tl.constexpr, TILES: tl.constexpr,
               OFFSET: tl.constexpr, w, xp, xp1, sc, acc, XS: tl.constexpr = 0, DQ: tl.constexpr = 0):
        """One 128-column block: the fragment MMAs, then scale-after into the fp32 accumulators.
        acc[8 * tile + 2 * r + e]: token tile `tile`, lane row r (a, b, c, d = g, g+8, g+16, g+24),
        token 2t + e of the tile (entries of absent rows / tiles pass through). XS: xp / xp1 are
        tuples of the shared-memory addresses of each token tile's inputs (`_xs_step`: 4 per tile of
        16-bit inputs, 2 of int8 codes), not pointers. DQ (groups of 32 / 64): the block's PTX dequantizes
        each weight with the lane's group's scale and min (`_dq_scales`, after the inputs) and its outputs are
        the block's dot products, added as they are."""
        if XS:
            if TILES == 2:
                xp = xp + xp1
            w4 = (w[0], w[1], w[2], w[3]) + xp
            w8 = (w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]) + xp
            w16 = w + xp
        else:
            if TILES == 2:
                xq = (xp, xp1)
            else:
                xq = (xp,)
            w4 = (w[0], w[1], w[2], w[3]) + xq
            w8 = (w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]) + xq
            w16 = w + xq
        if DQ:
            dqs = _dq_scales(sc, ROWS, DQ)
            w4 = w4 + dqs
            w8 = w8 + dqs
            w16 = w16 + dqs
            sa, ma, sb, mb, sc_, mc, sd, md = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0  # (unused: `_fold` adds the
            # block's dot products)
        else:
            sa = sc[0].to(tl.float32)
            ma = sc[1].to(tl.float32) - OFFSET * sa
            sb = sc[2].to(tl.float32)
            mb = sc[3].to(tl.float32) - OFFSET * sb
            sc_ = sc[4].to(tl.float32)
            mc = sc[5].to(tl.float32) - OFFSET * sc_
            sd = sc[6].to(tl.float32)
            md = sc[7].to(tl.float32) - OFFSET * sd
        p0, p1, p2, p3, p4, p5, p6, p7, q0, q1, q2, q3, q4, q5, q6, q7 = acc
        if ROWS == 32:
            if TILES == 2:
                da0, da1, db0, db1, dc0, dc1, dd0, dd1, e0, e1, fa0, fa1, fb0, fb1, fc0, fc1, fd0, fd1, f0, f1 = \
                    tl.inline_asm_elementwise(ASM, CONSTRAINTS, w16, dtype=(tl.float32,) * 20, is_pure=True,
                                              pack=1)
                q0, q1 = _fold(fa0, fa1, f0, f1, sa, ma, q0, q1, DQ)
                q2, q3 = _fold(fb0, fb1, f0, f1, sb, mb, q2, q3, DQ)
                q4, q5 = _fold(fc0, fc1, f0, f1, sc_, mc, q4, q5, DQ)
                q6, q7 = _fold(fd0, fd1, f0, f1, sd, md, q6, q7, DQ)
            else:
                da0, da1, db0, db1, dc0, dc1, dd0, dd1, e0, e1 = tl.inline_asm_elementwise(
                    ASM, CONSTRAINTS, w16, dtype=(tl.float32,) * 10, is_pure=True, pack=1)
            p0, p1 = _fold(da0, da1, e0, e1, sa, ma, p0, p1, DQ)
            p2, p3 = _fold(db0, db1, e0, e1, sb, mb, p2, p3, DQ)
            p4, p5 = _fold(dc0, dc1, e0, e1, sc_, mc, p4, p5, DQ)
            p6, p7 = _fold(dd0, dd1, e0, e1, sd, md, p6, p7, DQ)
        elif ROWS == 16:
            if TILES == 2:
                da0, da1, db0, db1, e0, e1, fa0, fa1, fb0, fb1, f0, f1 = tl.inline_asm_elementwise(
                    ASM, CONSTRAINTS, w8, dtype=(tl.float32,) * 12, is_pure=True, pack=1)
            else:
                da0, da1, db0, db1, e0, e1 = tl.inline_asm_elementwise(
                    ASM, CONSTRAINTS, w8, dtype=(tl.float32,) * 6, is_pure=True, pack=1)
            p0, p1 = _fold(da0, da1, e0, e1, sa, ma, p0, p1, DQ)
            p2, p3 = _fold(db0, db1, e0, e1, sb, mb, p2, p3, DQ)
            if TILES == 2:
                q0, q1 = _fold(fa0, fa1, f0, f1, sa, ma, q0, q1, DQ)
                q2, q3 = _fold(fb0, fb1, f0, f1, sb, mb, q2, q3, DQ)
        else:
            if TILES == 2:
                da0, da1, e0, e1, fa0, fa1, f0, f1 = tl.inline_asm_elementwise(
                    ASM, CONSTRAINTS, w4, dtype=(tl.float32,) * 8, is_pure=True, pack=1)
                q0, q1 = _fold(fa0, fa1, f0, f1, sa, ma, q0, q1, DQ)
            else:
                da0, da1, e0, e1 = tl.inline_asm_elementwise(ASM, CONSTRAINTS, w4, dtype=(tl.float32,) * 4,
                                                             is_pure=True, pack=1)
            p0, p1 = _fold(da0, da1, e0, e1, sa, ma, p0, p1, DQ)
        return p0, p1, p2, p3, p4, p5, p6, p7, q0, q1, q2, q3, q4, q5, q6, q7


    @triton.jit
    def _mma_gemv_kernel(x_ptr, qw_ptr, s_ptr, mn_ptr, y_ptr, ws_ptr, cnt_ptr, xs_ptr, M, N, K, stride_xm, stride_ym,
                         G: tl.constexpr, WARPS: tl.constexpr, SPLIT_K: tl.constexpr, ASM: tl.constexpr,
                         CONSTRAINTS: tl.constexpr, ROWS: tl.constexpr, TILES: tl.constexpr, TG: tl.constexpr,
                         ZPID: tl.constexpr,
                         OFFSET: tl.constexpr, U: tl.constexpr, HAS_XS: tl.constexpr, PDL: tl.constexpr,
                         L2_PREFETCH: tl.constexpr, LOAD: tl.constexpr, SHINT: tl.constexpr, TILED: tl.constexpr,
                         TRIGGER: tl.constexpr = 1, TAIL: tl.constexpr = 0, KWARPS: tl.constexpr = 1,
                         PRE: tl.constexpr = 0, L2_AHEAD: tl.constexpr = 0, EVEN: tl.constexpr = 0,
                         RES: tl.constexpr = 0, XS: tl.constexpr = 0, XS_DECL: tl.constexpr = "",
                         XS_ROWB: tl.constexpr = 256, KSUM: tl.constexpr = 0, KSUM_DECL: tl.constexpr = "",
                         KSUM_ST: tl.constexpr = "", KSUM_STC: tl.constexpr = "", KSUM_LD: tl.constexpr = "",
                         TRACE: tl.constexpr = 0, GLU: tl.constexpr = 0, DQ: tl.constexpr = 0,
                         XT: tl.constexpr = 0, XW: tl.constexpr = 8, YT: tl.constexpr = 0,
                         GS: tl.constexpr = 0):
        # Every per-lane quantity comes from the lane's own %tid.x, so the fragment plan holds
        # whatever layout Triton picks for these [32 * WARPS] tensors (one element per thread).
        # ROWS: weight rows per warp; lane (g, t) holds rows g, g+8, g+16, g+24 of them.
        # KWARPS > 1: each group of KWARPS consecutive warps shares one set of rows, warp w of the
        # group runs the w-th K slice of the program's, and the group's partials are summed in the
        # CTA (shared memory) before the store: a K split without the global split-K tail.
        # GLU (SwiGLU's gate_up, `mma_gemv(..., glu=True)`): N = 2I rows, gate rows first; a lane's rows a / c
        # are gate rows p, p + 8 of the program's pairs and b / d the up rows I + p, I + p + 8, so its
        # accumulators hold both halves of its pairs and the epilogue stores silu(gate) * up, [M, I]
        RG: tl.constexpr = WARPS // KWARPS
        BN: tl.constexpr = ROWS * RG
        # token groups (> 1 from 17 tokens) are neighbours in the launch order. One group (ZPID): the
        # token offset from program_id(2) (always 0 here), as before stop 34. The arithmetic is the same,
        # but ptxas allocates otherwise (o / down at one token: 92 registers, 72 with the neighbour form)
        # and the whole W4A16 step at one token took 1.09x as long with the neighbour form (stop 35)
        pid_n = tl.program_id(0) // TG
        pid_k = tl.program_id(1)
        if ZPID:
            m0_tok = tl.program_id(2) * 8 * TILES  # B columns: tokens m0_tok + g (and m0_tok + 8 + g)
        else:
            m0_tok = (tl.program_id(0) % TG) * 8 * TILES
        tid = _thread_id(tl.zeros([32 * WARPS], dtype=tl.int32))
        if TRACE:
            _trace(ws_ptr, tid, 0)
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        warp = tid // 32
        if GLU:
            row_a = pid_n * (BN // 2) + (warp // KWARPS) * (ROWS // 2) + g  # the lane's first pair
        else:
            row_a = pid_n * BN + (warp // KWARPS) * ROWS + g
        KW = tl.multiple_of(K // 8, 16 * SPLIT_K * KWARPS * U)
        kws = KW // (SPLIT_K * KWARPS)
        n_groups = K // G
        tok0 = tl.minimum(m0_tok + g, M - 1)  # absent tokens repeat the last one (never stored)
        tok1 = tl.minimum(m0_tok + 8 + g, M - 1)
        qw32 = qw_ptr.to(tl.pointer_type(tl.int32))
        # the lane's rows, clamped (rows past N are read but never stored)
        if GLU:  # (pairs past I clamp to the last pair: read, never stored)
            ra = tl.minimum(row_a, N // 2 - 1)
            rb = ra + N // 2
            rc = tl.minimum(row_a + 8, N // 2 - 1)
            rd = rc + N // 2
        else:
            ra = tl.minimum(row_a, N - 1)
            rb = tl.minimum(row_a + 8, N - 1)
            rc = tl.minimum(row_a + 16, N - 1)
            rd = tl.minimum(row_a + 24, N - 1)
        if TILED and GLU:  # every row r = 8j + g (I % 8 == 0) at its place in its 16-row chunk
            wa_ptr = qw32 + (ra // 16).to(tl.int64) * KW * 16 + 128 * ((ra // 8) % 2) + 4 * lane
            wb_ptr = qw32 + (rb // 16).to(tl.int64) * KW * 16 + 128 * ((rb // 8) % 2) + 4 * lane
            wc_ptr = qw32 + (rc // 16).to(tl.int64) * KW * 16 + 128 * ((rc // 8) % 2) + 4 * lane
            wd_ptr = qw32 + (rd // 16).to(tl.int64) * KW * 16 + 128 * ((rd // 8) % 2) + 4 * lane
        elif TILED:  # blocks16 layout (quant.int4): a 1 KB chunk per (16 rows, block), a warp reads 512 B at once
            wa_ptr = qw32 + (ra // 16).to(tl.int64) * KW * 16 + 128 * ((ra // 8) % 2) + 4 * lane
            wb_ptr = wa_ptr + 128
            wc_ptr = qw32 + (rc // 16).to(tl.int64) * KW * 16 + 128 * ((rc // 8) % 2) + 4 * lane
            wd_ptr = wc_ptr + 128
        else:
            wa_ptr = qw32 + ra.to(tl.int64) * KW + 4 * t
            wb_ptr = qw32 + rb.to(tl.int64) * KW + 4 * t
            wc_ptr = qw32 + rc.to(tl.int64) * KW + 4 * t
            wd_ptr = qw32 + rd.to(tl.int64) * KW + 4 * t
        w_ptrs = (wa_ptr, wb_ptr, wc_ptr, wd_ptr)
        if XT:  # x in `to_x_tiles`' layout: XT elements per 16-byte chunk, the lanes' chunks side by side. An
            # absent token's lanes read the last token's place, so producers write no padding rows (and at
            # one token a warp load reads that token's 64 bytes, not 512 bytes of copies)
            x0 = x_ptr + (tok0 // 8) * (K * 8) + (4 * (tok0 % 8) + t) * XT
            x1 = x_ptr + (tok1 // 8) * (K * 8) + (4 * (tok1 % 8) + t) * XT
        else:
            x0 = x_ptr + tok0 * stride_xm + 32 * t
            x1 = x_ptr + tok1 * stride_xm + 32 * t
        if G < 128:  # DQ: the lane's 32 columns of each block lie in group (block start + 32 t) / G
            lg = (32 * t) // G
            s_offs = (ra * n_groups + lg, rb * n_groups + lg, rc * n_groups + lg, rd * n_groups + lg)
        else:
            s_offs = (ra * n_groups, rb * n_groups, rc * n_groups, rd * n_groups)
        zero = tl.zeros([32 * WARPS], dtype=tl.float32)
        acc = (zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero)
        k_lo = (pid_k * KWARPS + warp % KWARPS) * kws
        k_last = k_lo + kws - 16 * U
        if TRIGGER == 1:
            launch_dependents(PDL)
        if L2_PREFETCH:  # the program's whole weight slice into L2 before the wait
            _prefetch_blocks(qw32, ra, rc, KW, k_lo, kws, lane, t, row_a, N, ROWS, TILED)
        elif L2_AHEAD > 0:  # the L2_AHEAD steps after the first, ahead of the loop's own prefetch
            _prefetch_blocks(qw32, ra, rc, KW, tl.minimum(k_lo + 16 * U, k_lo + kws),
                             tl.minimum(16 * U * L2_AHEAD, kws - 16 * U), lane, t, row_a, N, ROWS, TILED)
        if XS:
            # xshare: the RG warps that run the same K slice (one per row group) load each block's inputs
            # for the program's tokens once, into shared memory (double buffered, one named barrier per
            # block), and read their B fragments there: RG times fewer activation bytes from L2 than
            # every warp loading its own
            XS_NT: tl.constexpr = RG * 32
            XS_NCH: tl.constexpr = (8 * TILES * (XS_ROWB // 16)) // XS_NT
            XS_BUFB: tl.constexpr = 8 * TILES * XS_ROWB
            xs_buf = _xs_base(tid, XS_DECL) + (warp % KWARPS) * (2 * XS_BUFB)
            xs_q = (warp // KWARPS) * 32 + lane
            xs_bar = 1 + warp % KWARPS
            xi32 = x_ptr.to(tl.pointer_type(tl.int32))
            srow = (stride_xm * XS_ROWB) // 512  # int32 words per token row
        if PRE > 0:  # the warp's whole K slice (PRE blocks) in flight before the wait: with an early
            # PDL trigger it streams while the predecessor still runs
            wl = ()
            sl = ()
            for i in tl.static_range(PRE):
                wl = wl + (_load_rows(w_ptrs, k_lo + 16 * i, ROWS, LOAD, TILED),)
                sl = sl + (_load_scales(s_ptr, mn_ptr, s_offs, _group_of(k_lo + 16 * i, G, GS), ROWS, SHINT),)
            grid_wait(PDL)
            if TRACE == 2:
                _trace(ws_ptr, tid, 1)
            if TRIGGER == 3:
                launch_dependents(PDL)
            if XS:
                _xs_first(xi32, srow, m0_tok, M, k_lo, xs_q, xs_buf, XS_NT, XS_NCH, XS_ROWB)
                for i in tl.static_range(PRE):
                    acc = _xs_step(ASM, CONSTRAINTS, ROWS, TILES, OFFSET, wl[i], sl[i], acc, xi32, srow, m0_tok, M,
                                   k_lo + 16 * (i + 1 - (i + 1) // PRE), xs_q, xs_buf, g, t, i % 2, xs_bar, XS_NT,
                                   XS_NCH, XS_BUFB, XS_ROWB, DQ)
            else:
                for i in tl.static_range(PRE):
                    acc = _block(ASM, CONSTRAINTS, ROWS, TILES, OFFSET, wl[i], x0 + (k_lo + 16 * i) * XW,
                                 x1 + (k_lo + 16 * i) * XW, sl[i], acc, 0, DQ)
        else:
            # U blocks per step, the next step's weights and scales loaded before this step's math:
            # 16*U bytes per lane and row in flight. Past the slice's end the last step re-reads itself.
            w, sc, w2, sc2 = _load_step(w_ptrs, s_ptr, mn_ptr, s_offs, k_lo, G, ROWS, LOAD, TILED, SHINT, U, GS)
            grid_wait(PDL)  # weights only above this line: x, y and the split-K buffers below
            if TRACE == 2:
                _trace(ws_ptr, tid, 1)
            if TRIGGER == 3:
                launch_dependents(PDL)
            if XS:  # (`_xs_step`; two blocks per trip with EVEN)
                _xs_first(xi32, srow, m0_tok, M, k_lo, xs_q, xs_buf, XS_NT, XS_NCH, XS_ROWB)
                if EVEN:
                    for it in range(0, kws, 32):
                        kw0 = k_lo + it
                        wn, sn, _, _ = _load_step(w_ptrs, s_ptr, mn_ptr, s_offs, kw0 + 16, G, ROWS, LOAD, TILED,
                                                  SHINT, 1, GS)
                        acc = _xs_step(ASM, CONSTRAINTS, ROWS, TILES, OFFSET, w, sc, acc, xi32, srow, m0_tok, M,
                                       kw0 + 16, xs_q, xs_buf, g, t, 0, xs_bar, XS_NT, XS_NCH, XS_BUFB, XS_ROWB, DQ)
                        w, sc, _, _ = _load_step(w_ptrs, s_ptr, mn_ptr, s_offs, tl.minimum(kw0 + 32, k_last), G,
                                                 ROWS, LOAD, TILED, SHINT, 1, GS)
                        acc = _xs_step(ASM, CONSTRAINTS, ROWS, TILES, OFFSET, wn, sn, acc, xi32, srow, m0_tok, M,
                                       tl.minimum(kw0 + 32, k_last), xs_q, xs_buf, g, t, 1, xs_bar, XS_NT,
                                       XS_NCH, XS_BUFB, XS_ROWB, DQ)
                else:
                    for it in range(0, kws, 16):
                        kw0 = k_lo + it
                        nxt = tl.minimum(kw0 + 16, k_last)
                        wn, sn, _, _ = _load_step(w_ptrs, s_ptr, mn_ptr, s_offs, nxt, G, ROWS, LOAD, TILED, SHINT, 1,
                                                  GS)
                        acc = _xs_step(ASM, CONSTRAINTS, ROWS, TILES, OFFSET, w, sc, acc, xi32, srow, m0_tok, M, nxt,
                                       xs_q, xs_buf, g, t, (it // 16) % 2, xs_bar, XS_NT, XS_NCH, XS_BUFB,
                                       XS_ROWB, DQ)
                        w = wn
                        sc = sn
                kws = 0  # the loops below have nothing left to do
            if U == 1 and EVEN and L2_AHEAD == 0:
                # two blocks per trip, still one block ahead: the loads land straight in the registers
                # the loop carries (a one-block loop copies 8+ registers per block at its end)
                for it in range(0, kws, 32):
                    kw0 = k_lo + it
                    wn, sn, _, _ = _load_step(w_ptrs, s_ptr, mn_ptr, s_offs, kw0 + 16, G, ROWS, LOAD, TILED, SHINT, 1,
                                              GS)
                    acc = _block(ASM, CONSTRAINTS, ROWS, TILES, OFFSET, w, x0 + kw0 * XW, x1 + kw0 * XW, sc, acc, 0, DQ)
                    w, sc, _, _ = _load_step(w_ptrs, s_ptr, mn_ptr, s_offs, tl.minimum(kw0 + 32, k_last), G, ROWS,
                                             LOAD, TILED, SHINT, 1, GS)
                    acc = _block(ASM, CONSTRAINTS, ROWS, TILES, OFFSET, wn, x0 + (kw0 + 16) * XW, x1 + (kw0 + 16) * XW,
                                 sn, acc, 0, DQ)
                kws = 0  # the stepped loop below has nothing left to do
            for it in range(0, kws, 16 * U):
                kw0 = k_lo + it
                nxt = tl.minimum(kw0 + 16 * U, k_last)
                wn, sn, wn2, sn2 = _load_step(w_ptrs, s_ptr, mn_ptr, s_offs, nxt, G, ROWS, LOAD, TILED, SHINT, U, GS)
                if L2_AHEAD > 0:  # one step more into L2, L2_AHEAD + 1 steps ahead of this one
                    ahead = kw0 + 16 * U * (L2_AHEAD + 1)
                    _prefetch_blocks(qw32, ra, rc, KW, ahead, tl.where(ahead < k_lo + kws, 16 * U, 0), lane, t,
                                     row_a, N, ROWS, TILED)
                acc = _block(ASM, CONSTRAINTS, ROWS, TILES, OFFSET, w, x0 + kw0 * XW, x1 + kw0 * XW, sc, acc, 0, DQ)
                w = wn
                sc = sn
                if U == 2:
                    acc = _block(ASM, CONSTRAINTS, ROWS, TILES, OFFSET, w2, x0 + (kw0 + 16) * XW, x1 + (kw0 + 16) * XW,
                                 sc2, acc, 0, DQ)
                    w2 = wn2
                    sc2 = sn2
        if TRIGGER == 2:
            launch_dependents(PDL)
        if KSUM:  # K slices summed through the kernel's own shared memory (TileConfig.ksum; SPLIT_K == 1)
            NV: tl.constexpr = 2 * (ROWS // 8) * TILES
            CP: tl.constexpr = (KWARPS * 32) // ROWS  # token columns per pass of the CTA's threads
            kbuf = _xs_base(tid, KSUM_DECL)
            z = _cta_sync(_ksum_store(kbuf + 4 * (warp * NV * _KSUM_PAD + lane), acc, ROWS, TILES, KSUM_ST, KSUM_STC))
            _ksum_pass(kbuf + z, 0, tid, pid_n, m0_tok, xs_ptr, y_ptr, M, N, stride_ym, ROWS, TILES, RG, KWARPS, NV,
                       KSUM_LD, HAS_XS)
            for j in tl.static_range(1, (8 * TILES + CP - 1) // CP):
                if j * CP < M - m0_tok:  # (no thread of a pass past the program's last token has work)
                    _ksum_pass(kbuf + z, j * CP, tid, pid_n, m0_tok, xs_ptr, y_ptr, M, N, stride_ym, ROWS, TILES,
                               RG, KWARPS, NV, KSUM_LD, HAS_XS)
        elif GLU:
            _glu_epilogue(acc, pid_n, m0_tok, xs_ptr, y_ptr, M, N // 2, stride_ym, row_a, t, ROWS, TILES, RG, KWARPS,
                          HAS_XS, YT)
        else:
            _mma_epilogue(acc, pid_n, pid_k, m0_tok, xs_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, row_a, t,
                          ROWS, TILES, RG, KWARPS, HAS_XS, ZPID, SPLIT_K, TAIL)
        if TRACE:  # (the launch passes its trace rows as ws_ptr: split_k 1 has no workspace)
            _trace(ws_ptr, tid, 2)


    @triton.jit
    def _mma_epilogue(acc, pid_n, pid_k, m0_tok, xs_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, row_a, t,
                      ROWS: tl.constexpr, TILES: tl.constexpr, RG: tl.constexpr, KWARPS: tl.constexpr,
                      HAS_XS: tl.constexpr, ZPID: tl.constexpr, SPLIT_K: tl.constexpr, TAIL: tl.constexpr):
        """Stop 22's epilogue: the K slices of each row group summed by tl.reduce (kwarps tiles), the
        accumulators joined into [RG * 32, values] and stored through splitk_finish."""
        BN: tl.constexpr = ROWS * RG
        if KWARPS > 1:  # sum each row group's K slices in the CTA; the epilogue runs on [RG * 32]
            acc = _kwarps_sum(acc, ROWS, TILES, RG, KWARPS)
            r = tl.arange(0, RG * 32)  # element i of the [32 * WARPS] tensors is thread i's
            row_a = pid_n * BN + (r // 32) * ROWS + (r % 32) // 4
            t = r % 4
        # element (lane, i): accumulator i -> (token tile, row a/b/c/d, token 2t + e)
        e2 = tl.arange(0, 2)[None, :]
        col0 = m0_tok + 2 * t[:, None] + e2
        ra = tl.join(row_a, row_a)
        rb = ra + 8
        p_a = tl.join(acc[0], acc[1])
        p_b = tl.join(acc[2], acc[3])
        q_a = tl.join(acc[8], acc[9])
        q_b = tl.join(acc[10], acc[11])
        if ROWS == 32:
            p_c = tl.join(acc[4], acc[5])
            p_d = tl.join(acc[6], acc[7])
            if TILES == 2:
                out = _cat2(_cat4(p_a, p_b, p_c, p_d), _cat4(q_a, q_b, tl.join(acc[12], acc[13]),
                                                             tl.join(acc[14], acc[15])))
                row = _cat2(_cat4(ra, rb, ra + 16, rb + 16), _cat4(ra, rb, ra + 16, rb + 16))
                col = _cat2(_cat4(col0, col0, col0, col0), _cat4(col0 + 8, col0 + 8, col0 + 8, col0 + 8))
            else:
                out = _cat4(p_a, p_b, p_c, p_d)
                row = _cat4(ra, rb, ra + 16, rb + 16)
                col = _cat4(col0, col0, col0, col0)
        elif ROWS == 16:
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
        if ZPID:  # one arrival counter per (token group, row) tile
            tile = tl.program_id(2) * tl.num_programs(0) + pid_n
        else:
            tile = tl.program_id(0)
        splitk_finish(out, y_ptr + col * stride_ym + row, ws_ptr, cnt_ptr, col * N + row, mask, tile, pid_k,
                      M * N, SPLIT_K, TAIL)


    @triton.jit
    def _kwarps_sum(acc, ROWS: tl.constexpr, TILES: tl.constexpr, RG: tl.constexpr, KWARPS: tl.constexpr):
        """The 16 accumulators of [RG * KWARPS * 32] -> [RG * 32]: each row group's K slices summed."""
        p = _ksum4(acc[0], acc[1], acc[2], acc[3], RG, KWARPS)
        pc = (acc[4], acc[5], acc[6], acc[7])
        if ROWS == 32:
            pc = _ksum4(acc[4], acc[5], acc[6], acc[7], RG, KWARPS)
        q = p  # the second token tile's, if any
        qc = pc
        if TILES == 2:
            q = _ksum4(acc[8], acc[9], acc[10], acc[11], RG, KWARPS)
            if ROWS == 32:
                qc = _ksum4(acc[12], acc[13], acc[14], acc[15], RG, KWARPS)
        return (p[0], p[1], p[2], p[3], pc[0], pc[1], pc[2], pc[3], q[0], q[1], q[2], q[3], qc[0], qc[1],
                qc[2], qc[3])


    @triton.jit
    def _glu_tile(acc, i: tl.constexpr, dt: tl.constexpr, scale):
        """silu(gate) * up of the pair held in accumulators i..i+3 (gate tokens 2t, 2t+1, then up's), each
        half scaled by its token's activation scale (codes in; 1.0 otherwise) and rounded to the output dtype
        first, as the unfused gate_up store and SwiGLU kernel round them."""
        g = (tl.join(acc[i], acc[i + 1]) * scale).to(dt)
        u = (tl.join(acc[i + 2], acc[i + 3]) * scale).to(dt)
        return _silu_mul(g, u).to(dt)


    @triton.jit
    def _glu_epilogue(acc, pid_n, m0_tok, xs_ptr, y_ptr, M, I, stride_ym, row_p, t, ROWS: tl.constexpr,
                      TILES: tl.constexpr, RG: tl.constexpr, KWARPS: tl.constexpr, HAS_XS: tl.constexpr,
                      YT: tl.constexpr = 0):
        """GLU launches (split_k 1): the lane's pairs p (rows a / b) and p + 8 (rows c / d) for its tokens,
        stored as silu(gate) * up into y [M, I]. HAS_XS: activation codes in, each token's scale applied to
        both halves before they are rounded (as `_mma_epilogue` applies it before the store). YT > 0: y is
        down's input in `x_tiles`' layout (the real tokens' rows: a fragment kernel never reads the
        absent ones')."""
        if KWARPS > 1:
            acc = _kwarps_sum(acc, ROWS, TILES, RG, KWARPS)
            r = tl.arange(0, RG * 32)
            row_p = pid_n * (RG * ROWS // 2) + (r // 32) * (ROWS // 2) + (r % 32) // 4
            t = r % 4
        dt: tl.constexpr = y_ptr.dtype.element_ty
        e2 = tl.arange(0, 2)[None, :]
        col0 = m0_tok + 2 * t[:, None] + e2
        rp = tl.join(row_p, row_p)
        s0 = 1.0
        s1 = 1.0
        if HAS_XS:
            s0 = tl.load(xs_ptr + col0, mask=col0 < M, other=0.0)
            s1 = tl.load(xs_ptr + col0 + 8, mask=col0 + 8 < M, other=0.0)
        out = _glu_tile(acc, 0, dt, s0)
        row = rp
        col = col0
        if ROWS == 32:
            out = _cat2(out, _glu_tile(acc, 4, dt, s0))
            row = _cat2(row, rp + 8)
            col = _cat2(col, col0)
        if TILES == 2:
            out2 = _glu_tile(acc, 8, dt, s1)
            row2 = rp
            if ROWS == 32:
                out2 = _cat2(out2, _glu_tile(acc, 12, dt, s1))
                row2 = _cat2(row2, rp + 8)
            out = _cat2(out, out2)
            row = _cat2(row, row2)
            col = _cat2(col, col + 8)
        if YT:
            tl.store(y_ptr + x_tile_offsets(col, row, I // 128), out, mask=(row < I) & (col < M))
        else:
            tl.store(y_ptr + col * stride_ym + row, out, mask=(row < I) & (col < M))


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


#: groups under a block that 16-bit inputs run dequantized before the MMA (`_mma_asm`'s dequant): a lane's
#: 32 columns of a block then lie in one group
DEQUANT_GROUPS = (32, 64)


def group_signed(tiles: int, codes: bool, dequant: bool) -> int:
    """The launch's scale group division: `GROUP_SIGNED` where an experiment sets it, else the switch's."""
    return GROUP_SIGNED if GROUP_SIGNED >= 0 else switches.group_signed(tiles, codes, dequant)


def mma_gemv_supports(store: Int4Weight, cfg: TileConfig, m: int = 1, dtype=torch.bfloat16) -> bool:
    """Groups a multiple of 128 (a block never straddles one; 32 or 64 with 16-bit inputs, dequantized
    before the MMA), K tiled by the split (and 2-block
    steps), bf16/fp16 activations, and a contiguous 16-byte aligned qweight (the PTX loads 16 B);
    preload: at most PRELOAD_REGISTERS weight registers per lane, and not with 2-block steps (it has no steps)."""
    k, g = store.in_features, store.group_size
    step = BLOCK_COLS * cfg.split_k * cfg.kwarps * (2 if cfg.prefetch else 1)
    q = store.qweight
    blocks = k // (BLOCK_COLS * cfg.split_k * cfg.kwarps)  # per warp (k not tiled so fails below)
    if cfg.stages > 1:  # shared-memory rings (stop 33's TMA ring, stop 43's lane ring: never faster; their
        # patches are results/mma_bulk_ring_x_prefetch.patch and results/lane_ring_stop52.patch)
        return False
    if cfg.pairs and (cfg.prefetch or cfg.preload or blocks % 2):
        return False
    if cfg.xshare and not xshare_fits(cfg, m, dtype):
        return False
    if cfg.ksum and not ksum_fits(cfg, m, dtype):
        return False
    if cfg.preload and (cfg.prefetch or cfg.bm not in ROWS_PER_WARP or
                        blocks * 4 * (cfg.bm // 8) > PRELOAD_REGISTERS):
        return False
    groups_ok = g % BLOCK_COLS == 0 or (g in DEQUANT_GROUPS and dtype in (torch.bfloat16, torch.float16))
    return (1 <= m <= MAX_TOKENS and cfg.bm in ROWS_PER_WARP and groups_ok and k % step == 0
            and cfg.warps % cfg.kwarps == 0 and dtype in (torch.bfloat16, torch.float16, torch.int8)
            and q.is_contiguous() and q.data_ptr() % 16 == 0)


def mma_glu_supports(store: Int4Weight, cfg: TileConfig, m: int = 1, dtype=torch.bfloat16, codes: bool = False) -> bool:
    """Whether `mma_gemv(..., glu=True)` runs this tile: 16-bit inputs, or activation codes (int8, or exact
    integers in 16 bits) with their token scales; 16 or 32 rows per warp (a lane then holds a gate row and its
    up row), no split-K and no shared-memory K sum (their epilogues store rows one by one), no L2-ahead
    prefetch, and an even row count whose halves are whole 8-row groups."""
    n = store.out_features
    ok_dtype = dtype in (torch.bfloat16, torch.float16) or (codes and dtype == torch.int8)
    return (ok_dtype and cfg.bm in (16, 32) and cfg.split_k == 1 and not cfg.ksum
            and n % 16 == 0 and L2_AHEAD == 0 and mma_gemv_supports(store, cfg, m, dtype))


def xshare_row_bytes(dtype) -> int:
    """Bytes of one token's inputs to a block: 128 columns of bf16 / fp16, or of int8 codes."""
    return BLOCK_COLS * (1 if dtype == torch.int8 else 2)


def xshare_fits(cfg: TileConfig, m: int, dtype=torch.bfloat16) -> bool:
    """xshare: at least two row groups per CTA that split each block's token rows evenly (16-byte
    chunks), one block per step (two per trip with pairs), and the buffers in static shared memory."""
    tiles = 2 if m > 8 else 1
    rg = cfg.warps // cfg.kwarps
    rowb = xshare_row_bytes(dtype)
    return (dtype in (torch.bfloat16, torch.float16, torch.int8) and rg >= 2
            and (8 * tiles * rowb // 16) % (32 * rg) == 0 and not cfg.prefetch and L2_AHEAD == 0
            and xshare_bytes(tiles, cfg.kwarps, rowb) <= 48 * 1024)


def mma_gemv(x: torch.Tensor, store: Int4Weight, cfg: TileConfig, token_scales: torch.Tensor | None = None,
             out_dtype: torch.dtype | None = None, pdl: bool | None = None,
             l2_prefetch: bool | None = None, trigger: int | None = None, tail: int = 0,
             glu: bool = False, fragment_order: bool | None = None, x_tiles: int = 0,
             y_tiles: bool = False) -> torch.Tensor:
    """y [M, N] = x [M, K] @ dequant(W).T for 1 <= M <= 64, 16 tokens per program (cfg: bm = 8, 16 or
    32 weight rows per warp, warps, split_k over programs, kwarps = warps sharing rows that split K inside the CTA,
    prefetch = 2 blocks per step, preload = the warp's whole K slice loaded before the PDL wait,
    pairs = two blocks per loop trip, maxnreg = a register cap; stages must be 1).
    With token_scales [M] (fp32), x holds activation codes and y = token_scales[:, None] *
    (x @ dequant(W).T). pdl / l2_prefetch / trigger (defaults: `pdl.py`'s switches and
    `pdl_trigger`) change timing only, never the result; tail != 0 is a timing experiment with
    wrong results (`splitk_finish`). glu: the store is SwiGLU's gate_up (gate rows, then up rows) and y
    [M, N / 2] = silu(gate) * up, bit for bit what the unfused gate_up and `silu_mul_triton` give
    (`mma_glu_supports` says which tiles can). fragment_order: x is in `to_fragment_order`'s column order
    (16-bit inputs; int8 codes since stop 69), and y is bit for bit what natural-order x gives (a kernel
    without the input PRMTs: stop 52). x_tiles = M > 0: x is `to_x_tiles` of M tokens, which every warp loads 512 contiguous bytes at a
    time (the rows past M are never read: their lanes read token M - 1's place); y is bit for bit what x in
    order gives (stop 64; global-memory inputs only). Their 16-bit chunks are in fragment order unless
    fragment_order=False says they are not, int8 codes' only if fragment_order=True (`tiles_in_fragment_order`).
    y_tiles (with glu, 16-bit inputs): y, down's input, in that layout, as [`x_tile_rows(M)`, N / 2]."""
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # (host time: eager decode pays every line)
    m = x_tiles or x2.shape[0]
    if x_tiles and (x2.shape[0] != x_tile_rows(m) or cfg.xshare or store.group_size % BLOCK_COLS
                    or not x2.is_contiguous()):
        raise ValueError(f"x-tile inputs: a contiguous [{x_tile_rows(m)}, K] tensor (to_x_tiles) for a tile "
                         f"without xshare and groups of a multiple of {BLOCK_COLS}; got {tuple(x2.shape)}, "
                         f"tile {cfg.key()}, group {store.group_size}")
    if not mma_gemv_supports(store, cfg, m, x2.dtype):
        raise ValueError(f"mma_gemv serves 1..{MAX_TOKENS} bf16/fp16 tokens with groups of a multiple of "
                         f"{BLOCK_COLS}; got M={m}, {x2.dtype}, group {store.group_size}, K={store.in_features}, "
                         f"tile {cfg.key()}")
    dequant = store.group_size % BLOCK_COLS != 0
    fragment_order = tiles_in_fragment_order(x2.dtype, fragment_order) if x_tiles else bool(fragment_order)
    if dequant and fragment_order:
        raise ValueError("fragment-order inputs need groups of a multiple of 128")
    if glu and not mma_glu_supports(store, cfg, m, x2.dtype, codes=token_scales is not None):
        raise ValueError(f"no SwiGLU epilogue for tile {cfg.key()} on {store.out_features} rows of "
                         f"{x2.dtype} inputs (mma_glu_supports)")
    if x2.stride(-1) != 1 or (x2.stride(0) * x2.element_size()) % 16 or x2.data_ptr() % 16:
        x2 = x2.contiguous()
    n = store.out_features
    if y_tiles and (not glu or token_scales is not None or (n // 2) % BLOCK_COLS):
        raise ValueError(f"x-tile outputs come from the SwiGLU epilogue on 16-bit inputs with N / 2 a multiple of "
                         f"{BLOCK_COLS}; got glu={glu}, codes={token_scales is not None}, N={n}")
    y = torch.empty((x_tile_rows(m) if y_tiles else m, n // 2 if glu else n), device=x2.device,
                    dtype=out_dtype or x2.dtype)
    # TileConfig.bm: weight rows per warp (8: A rows 8..15 give sum(x); 16: an extra MMA does; 32: two
    # A fragments per B fragment, half the activation loads per weight)
    tiles = 2 if m > 8 else 1  # 9..16 tokens: both token tiles share each A fragment (weights read once)
    bn = cfg.bm * (cfg.warps // cfg.kwarps)
    tg = cdiv(m, 8 * tiles)
    grid = (cdiv(n, bn) * tg, cfg.split_k, 1)
    ws, cnt = splitk_buffers(y, cfg.split_k, m * n, grid[0])
    trace = TRACE is not None and cfg.split_k == 1 and not glu
    if trace:  # rows of TRACE_ARENA, made before any capture: a buffer allocated here could share memory
        # with an earlier kernel's freed output, which that kernel may still write while this one's
        # programs store their start times (before their PDL wait); and a memset would break the PDL chain
        used = TRACE[-1]["first"] + TRACE[-1]["rows"].shape[0] if TRACE else 0
        ws = TRACE_ARENA[used: used + grid[0] * grid[1] * grid[2]]
        if ws.shape[0] < grid[0] * grid[1] * grid[2]:
            raise RuntimeError(f"TRACE_ARENA holds {TRACE_ARENA.shape[0]} rows; this launch needs rows {used}.."
                               f"{used + grid[0] * grid[1] * grid[2]}")
        TRACE.append({"rows": ws, "first": used, "n": n, "k": store.in_features, "m": m, "tile": cfg.key()})
    xs = token_scales if token_scales is not None else y
    dt = {torch.bfloat16: "bf16", torch.float16: "f16", torch.int8: "s8"}[x2.dtype]
    if dt == "s8" and (token_scales is None or out_dtype is None):
        raise ValueError("int8 activation codes need their token_scales and an out_dtype")
    pdl = pdl_enabled(y) if pdl is None else (pdl and pdl_enabled(y))
    l2_prefetch = not glu and (l2_prefetch_enabled(y) if l2_prefetch is None else (l2_prefetch and l2_prefetch_enabled(y)))
    blocks = store.in_features // (BLOCK_COLS * cfg.split_k * cfg.kwarps)  # per warp
    pre = blocks if cfg.preload else 0
    if trigger is None:  # an experiment's override, else the tile's own point, else the rule by M
        trigger = TRIGGER if TRIGGER >= 0 else switches.gemv_trigger()
        if trigger < 0:
            trigger = cfg.trigger if cfg.trigger >= 0 else pdl_trigger(m, token_scales is not None)
    kernel = _mma_gemv_kernel[grid](x2, store.qweight, store.scales, store.mins, y, ws, cnt, xs, m, n, store.in_features,
                           x2.stride(0), y.stride(0), G=store.group_size, WARPS=cfg.warps, SPLIT_K=cfg.split_k,
                           ASM=block_asm(dt, cfg.bm, tiles, cfg.xshare, fragment_order, dequant, bool(x_tiles)),
                           CONSTRAINTS=block_constraints(dt, cfg.bm, tiles, cfg.xshare, dequant),
                           ROWS=cfg.bm, TG=tg,
                           ZPID=tg == 1 and bool(ONE_GROUP_Z) and token_scales is None,
                           TILES=tiles, OFFSET=OFFSET[dt],
                           U=2 if cfg.prefetch else 1, HAS_XS=token_scales is not None, PDL=pdl,
                           L2_PREFETCH=l2_prefetch, TRIGGER=trigger, PRE=pre, L2_AHEAD=L2_AHEAD,
                           EVEN=int(cfg.pairs),
                           LOAD=WEIGHT_LOADS[WEIGHT_LOAD["name"]], SHINT=WEIGHT_LOAD["scales"],
                           GS=group_signed(tiles, token_scales is not None, dequant),
                           TILED=store.layout == BLOCKS16,
                           num_warps=cfg.warps, num_stages=1, TAIL=tail, KWARPS=cfg.kwarps,
                           **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
                           RES=RESIDENCY, **launch_kwargs(pdl),
                           **(xshare_args(tiles, cfg.kwarps, x2.dtype) if cfg.xshare else {}),
                           **ksum_args(cfg, tiles),
                           **({"TRACE": 2 if TRACE_WAIT else 1} if trace else {}),
                           **({"GLU": 1} if glu else {}),
                           **({"DQ": 1 if dt == "bf16" else 2} if dequant else {}),
                           **({"XT": 16 // x2.element_size(), "XW": 64} if x_tiles else {}),
                           **({"YT": 1} if y_tiles else {}))
    if RESIDENCY and kernel is not None:  # (RES keys a compiled kernel per cap)
        residency.cap(kernel, RESIDENCY)
    return y if x.dim() == 2 or y_tiles else y.reshape(*x.shape[:-1], n)


def block_asm(dt: str, rows: int, tiles: int, shared: bool = False, fragment_order: bool = False,
              dequant: bool = False, x_tiles: bool = False) -> str:
    """The block PTX for activations of kind dt ('bf16', 'f16' or int8 codes 's8'), read from global
    memory or (`TileConfig.xshare`) from shared memory; fragment_order: inputs stored in fragment
    order (`to_fragment_order`); dequant: weights dequantized before the MMA (groups of 32 / 64);
    x_tiles: the inputs in `to_x_tiles`' layout (global memory only)."""
    if x_tiles:
        if shared or dequant:
            raise ValueError("x-tile inputs are read from global memory by blocks of groups of 128")
        return _x_tiles_asm(dt, rows, tiles, fragment_order)
    if dequant:
        if dt == "s8" or fragment_order:
            raise ValueError("dequantize-first blocks take 16-bit inputs in natural order")
        return MMA_ASM_DQ[(dt, rows, tiles, shared)]
    if fragment_order:
        if dt == "s8":
            return MMA_ASM_S8_FRAGMENT[(rows, tiles, shared)]
        return MMA_ASM_FRAGMENT[(dt, rows, tiles, shared)]
    if dt == "s8":
        return (MMA_ASM_S8_SHARED if shared else MMA_ASM_S8)[(rows, tiles)]
    if shared:
        return MMA_ASM_SHARED[(dt, rows, tiles)]
    return (MMA_ASM if FUSED_LOP3 else MMA_ASM_ANDOR)[(dt, rows, tiles)]


@functools.cache
def _x_tiles_asm(dt: str, rows: int, tiles: int, fragment_order: bool) -> str:
    if dt == "s8":
        return _mma_asm_s8(rows, tiles, x_step=X_TILE_CHUNK, fragment_order=fragment_order)
    return _mma_asm(dt, {"bf16": 0x4300, "f16": 0x6400}[dt], rows, tiles, fragment_order=fragment_order,
                    x_step=X_TILE_CHUNK)


def block_constraints(dt: str, rows: int, tiles: int, shared: bool = False, dequant: bool = False) -> str:
    """The operand constraints of `block_asm`: shared inputs come as one 32-bit address per 16-byte
    chunk (4 per token tile of 16-bit inputs, 2 of int8 codes) instead of one pointer per tile; dequant
    blocks take a packed (scale, min) pair per lane row after them."""
    extra = ",r" * (rows // 4) if dequant else ""
    if not shared:
        return CONSTRAINTS[(rows, tiles)] + extra
    return (CONSTRAINTS_SHARED_S8[(rows, tiles)] if dt == "s8" else CONSTRAINTS_SHARED[(rows, tiles)]) + extra


def ksum_fits(cfg: TileConfig, m: int, dtype=torch.bfloat16) -> bool:
    """TileConfig.ksum: K slices to sum in the CTA (kwarps > 1), no split-K, and the K-sum buffer plus
    any xshare buffers in static shared memory (48 KB)."""
    tiles = 2 if m > 8 else 1
    xs = xshare_bytes(tiles, cfg.kwarps, xshare_row_bytes(dtype)) if cfg.xshare else 0
    return cfg.kwarps > 1 and cfg.split_k == 1 and ksum_bytes(cfg.bm, tiles, cfg.warps) + xs <= 48 * 1024


@functools.lru_cache(maxsize=None)
def ksum_args(cfg: TileConfig, tiles: int) -> dict:
    """The kernel's K-sum constexprs (TileConfig.ksum): its buffer declaration and PTX (cached: every
    launch asks; callers only unpack the dict)."""
    if not cfg.ksum:
        return {}
    nv = ksum_values(cfg.bm, tiles)
    return {"KSUM": 1, "KSUM_DECL": ksum_decl(ksum_bytes(cfg.bm, tiles, cfg.warps)), "KSUM_ST": KSUM_STORE_ASM[nv],
            "KSUM_STC": KSUM_STORE_CONSTRAINTS[nv], "KSUM_LD": KSUM_LOAD_ASM[(cfg.kwarps, nv)]}


@functools.lru_cache(maxsize=None)
def xshare_args(tiles: int, kwarps: int, dtype) -> dict:
    """The kernel's xshare constexprs: its static buffer declaration and the bytes of a token row
    (cached like `ksum_args`)."""
    rowb = xshare_row_bytes(dtype)
    return {"XS": 1, "XS_DECL": _xshare_decl(xshare_bytes(tiles, kwarps, rowb)), "XS_ROWB": rowb}


def pdl_trigger(m: int, codes: bool = False) -> int:
    """Where a PDL launch lets the next kernel in: 1 = at the start, 2 = after the main loop, 3 = right
    after the PDL wait, 0 = at exit; `codes`: the launch reads activation codes (W4A8 / W4A4 / fp8).
    Why these points (H100; the measurements are "Stop 36" to "Stop 45" in docs/kernels_history.md):
    chains of linears alone (policy_ab) want early triggers everywhere, but in the engine a norm,
    attention or SwiGLU sits between the linears. Early triggers lost there until stop 45 made those
    small kernels let their successor in only after their own wait (`switches.small_trigger_rule`);
    since then the engine's graphed decode step (`trigger_matrix.py`) is fastest on bf16 inputs with
    the start trigger to 4 tokens, after the loop to 12 and right after the wait at 13-16 (0.97-0.98 of
    the earlier rule at 3 / 4 / 10 / 12 / 16 tokens; right after the wait costs 1.14-1.20x at 5..8).
    On codes, triggers after 4 tokens stayed even or lost end to end, so they keep the exit trigger.
    Judge this rule end to end, not on linears alone."""
    if codes:
        return 1 if m <= 2 else 2 if m <= 4 else 0
    return 1 if m <= 4 else 2 if m <= 12 else 3 if m <= 16 else 0


def mma_gemv_quantized(x2: torch.Tensor, store: Int4Weight, act, cfg: TileConfig, int8: bool = False,
                       fragment_order: bool = False) -> torch.Tensor:
    """W4A8 / W4A4 / W4A8-fp8 for 1..64 tokens: the activations are quantized per token (Triton),
    their codes stored as exact 16-bit floats and run through the same bf16/fp16 fragments; with
    integer codes every product and per-block sum is an exact integer in fp32, so this computes
    what an int8 MMA would (DPR padding: P_X = (8) padded to 16 bits). int8 (W4A8 / W4A4): the
    codes stay int8 and the int8 MMA runs them (`_mma_asm_s8`: half the code bytes and MMAs);
    fragment_order (int8): the quantizer stores them in `S8_FRAGMENT_ORDER` and the block reads them
    without its input PRMTs (the same bits)."""
    from gearshift.kernels.act_quant import quantize_act_triton

    codes, scales = quantize_act_triton(x2, act, codes_dtype=torch.int8 if int8 else x2.dtype,
                                        fragment_order=fragment_order)
    return mma_gemv(codes, store, cfg, token_scales=scales, out_dtype=x2.dtype, fragment_order=fragment_order)


def mma_config(n: int, k: int, m: int = 1) -> TileConfig:
    """The un-profiled default tile: what the H100 profile picked most for the Llama-3-8B shapes.
    Up to 8 tokens (benchmarks/results/kwarps_*.json): 16 rows per warp, 8 warps splitting K inside
    the CTA, 8 ways for N <= 8192 (one 16-row group per CTA) and 4 ways above (two groups).
    9..16 tokens (rows32_*.json): 32 rows per warp (half the activation loads per weight), 4 warps
    splitting K 4 ways, 2 blocks per step. Each warp gets >= 2 blocks; K that does not split so: 16
    rows per warp, 4 warps, K split over programs until there are ~600 of them (<= 8 slices)."""
    if m <= 8:
        for kw in ((8, 4, 2) if n <= 8192 else (4, 8, 2)):
            if k % (BLOCK_COLS * kw) == 0 and k // (BLOCK_COLS * kw) >= 2:
                return TileConfig(16, 0, BLOCK_COLS, 1, 8, 1, kwarps=kw)
    elif k % (BLOCK_COLS * 4 * 2) == 0:
        return TileConfig(32, 0, BLOCK_COLS, 1, 4, 1, prefetch=True, kwarps=4)
    progs = max(1, -(-n // 64))
    split = 1
    while split < 8 and progs * split < 600 and k % (BLOCK_COLS * split * 2) == 0 and k // (split * 2) >= 256:
        split *= 2
    return TileConfig(16, 0, BLOCK_COLS, split, 4, 1)


def mma_gemv_reference(x: torch.Tensor, store: Int4Weight) -> torch.Tensor:
    return linear_reference(x, store, None)
