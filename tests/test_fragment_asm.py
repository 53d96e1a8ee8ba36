"""The fragment kernel's block PTX itself, run for one warp on the CPU (`tests/ptx_warp.py`).

`test_kernels_int4_mma.py` checks a torch model of the fragment plan on CPU and the kernel on a GPU.
Here the shipped asm strings run instruction by instruction: for random int4 rows and inputs, every
lane's outputs must be its block sums, D[row, token] = sum_k (offset + q[row, k]) x[token, k] and
X[token] = sum_k x[token, k] (int8 codes: no offset, exact), for every row count, token tile count,
input dtype and input path (global or shared memory) the kernel launches."""
import itertools
import re

import numpy as np
import pytest
import torch

from ptx_warp import GROUP, THREAD, Memory, run  # tests/ptx_warp.py
from gearshift.kernels import int4_mma_gemv as mg

BASE = 1 << 12  # where the emulated memories start


def _lane_rows(per_lane: int) -> np.ndarray:
    """[32, per_lane] warp rows of each lane: g, g + 8, g + 16, g + 24."""
    return GROUP[:, None] + 8 * np.arange(per_lane)[None, :]


def _case(dt: str, rows: int, tiles: int, shared: bool, seed: int, fragment_order: bool = False,
          x_tiles: bool = False):
    """Operands, memories and the expected [32, n_out] outputs of one warp's block; fragment_order: the
    inputs stored in `to_fragment_order`'s column order; x_tiles: in `to_x_tiles`' layout."""
    rng = np.random.default_rng(seed)
    per_lane = rows // 8
    q = rng.integers(0, 16, size=(rows, mg.BLOCK_COLS))
    q[0, :8] = 15  # extreme codes in lane 0's first word
    q[min(1, rows - 1), :8] = 0
    words = np.zeros((rows, 16), dtype=np.uint32)
    for i in range(8):  # word w holds columns 8w .. 8w + 7, low nibble first
        words |= (q[:, i::8].astype(np.uint32) << np.uint32(4 * i))
    tokens = 8 * tiles
    if dt == "s8":
        x = rng.integers(-127, 128, size=(tokens, mg.BLOCK_COLS)).astype(np.int8)
        xv, esize, chunks = x.astype(np.float64), 1, 2
    else:
        tdt = torch.bfloat16 if dt == "bf16" else torch.float16
        xt = torch.from_numpy(3 * rng.standard_normal((tokens, mg.BLOCK_COLS))).to(tdt)
        x, xv, esize, chunks = xt.view(torch.int16).numpy(), xt.double().numpy(), 2, 4
    n_out = {1: 4, 2: 6, 4: 10}[per_lane] * tiles
    ops = {}
    lane_rows = _lane_rows(per_lane)
    for r in range(per_lane):
        for j in range(4):  # the lane's words 4t .. 4t + 3 of each of its rows
            ops[n_out + 4 * r + j] = words[lane_rows[:, r], 4 * THREAD + j]
    xp0 = n_out + 4 * per_lane
    row_bytes = mg.BLOCK_COLS * esize
    first = BASE + (GROUP * row_bytes + 32 * THREAD * esize).astype(np.int64)  # token g, the lane's first word
    if x_tiles:  # the lane's first chunk of the tile: 16 bytes at 16 * lane
        first = BASE + 16 * (4 * GROUP + THREAD).astype(np.int64)
    for tile in range(tiles):
        start = first + tile * 8 * row_bytes
        if shared:
            for j in range(chunks):
                ops[xp0 + chunks * tile + j] = start + 16 * j
        else:
            ops[xp0 + tile] = start
    xm = mg.to_fragment_order(torch.from_numpy(x)) if fragment_order else torch.from_numpy(x)
    mem = Memory((mg.to_x_tiles(xm) if x_tiles else xm).numpy(), BASE)
    memories = {"shared": mem} if shared else {"global": mem}
    offset = mg.OFFSET[dt]
    d = (offset + q.astype(np.float64)) @ xv.T  # [rows, tokens]
    mag = (offset + q.astype(np.float64)) @ np.abs(xv).T
    xs, xmag = xv.sum(axis=1), np.abs(xv).sum(axis=1)
    want, scale = [], []
    for tile in range(tiles):
        toks = 8 * tile + 2 * THREAD
        for r in range(per_lane):
            for dtok in (0, 1):
                want.append(d[lane_rows[:, r], toks + dtok])
                scale.append(mag[lane_rows[:, r], toks + dtok])
        want += [xs[toks], xs[toks + 1]]  # (8 rows: A rows 8..15 are 1.0, so D rows 8..15 carry them)
        scale += [xmag[toks], xmag[toks + 1]]
    return ops, memories, n_out, np.stack(want, axis=1), np.stack(scale, axis=1)


def _outputs(asm: str, ops, memories, n_out: int) -> np.ndarray:
    out = run(asm, ops, memories, n_out)
    return np.stack([o.view(np.float32).astype(np.float64) for o in out], axis=1)


def _reorder(per_lane: int, tiles: int) -> list[int]:
    """The asm's output operands (`_block_outputs`) in the order `_case` lists them: per token tile the
    rows' two tokens each, then the two token sums."""
    names = mg._block_outputs(per_lane, tiles)
    order = []
    for tile in range(tiles):
        o = 4 * tile
        rows = [f"d{o}", f"d{o + 1}", f"d{o + 2}", f"d{o + 3}"][: 2 if per_lane == 1 else 4]
        if per_lane == 4:
            rows += [f"f{o}", f"f{o + 1}", f"f{o + 2}", f"f{o + 3}"]
        sums = [f"d{o + 2}", f"d{o + 3}"] if per_lane == 1 else [f"e{o}", f"e{o + 1}"]
        order += [names.index(n) for n in rows + sums]
    return order


CASES = [(dt, rows, tiles, shared) for dt, rows, tiles, shared in
         itertools.product(("bf16", "f16", "s8"), mg.ROWS_PER_WARP, (1, 2), (False, True))]


@pytest.mark.parametrize("dt,rows,tiles,shared", CASES)
def test_block_asm_gives_the_block_sums(dt, rows, tiles, shared):
    ops, memories, n_out, want, scale = _case(dt, rows, tiles, shared, seed=rows * 10 + tiles)
    got = _outputs(mg.block_asm(dt, rows, tiles, shared), ops, memories, n_out)[:, _reorder(rows // 8, tiles)]
    if dt == "s8":
        assert np.array_equal(got, want)  # int32 sums, exact
        assert not re.search(r"mma.*f32", mg.block_asm(dt, rows, tiles, shared))  # the int8 MMA, not a float one
    else:
        assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-6), np.abs(got - want).max()


@pytest.mark.parametrize("dt,rows,tiles", [("bf16", 16, 1), ("f16", 32, 2), ("bf16", 8, 2)])
def test_ablation_forms_give_the_same_outputs(dt, rows, tiles):
    """AND + OR per nibble pair (`FUSED_LOP3 = False`) and inputs loaded ahead (`x_ahead`) run the same
    MMAs on the same operands, so the emulated outputs agree bit for bit."""
    magic = {"bf16": 0x4300, "f16": 0x6400}[dt]
    ops, memories, n_out, _, _ = _case(dt, rows, tiles, False, seed=7)
    ref = run(mg.block_asm(dt, rows, tiles), ops, memories, n_out)
    for asm in (mg.MMA_ASM_ANDOR[(dt, rows, tiles)], mg._mma_asm(dt, magic, rows, tiles, x_ahead=1)):
        assert all(np.array_equal(a, b) for a, b in zip(run(asm, ops, memories, n_out), ref))


def test_emulator_sees_a_wrong_selector():
    """The check is not blind: a block whose input PRMTs pair the wrong halves fails it."""
    ops, memories, n_out, want, scale = _case("bf16", 16, 1, False, seed=3)
    asm = mg.block_asm("bf16", 16, 1).replace("0x5410", "0x3210", 1)
    got = _outputs(asm, ops, memories, n_out)[:, _reorder(2, 1)]
    assert not np.all(np.abs(got - want) <= 1e-6 * scale + 1e-6)


def test_emulator_refuses_unknown_instructions():
    with pytest.raises(NotImplementedError):
        run("{\nmul.lo.u32 $0, $1, $1;\n}", {1: np.zeros(32, dtype=np.uint32)}, {}, 1)


@pytest.mark.parametrize("dt,rows,tiles,shared", CASES)
def test_fragment_order_block_gives_the_same_bits_without_input_prmts(dt, rows, tiles, shared):
    """Inputs stored in fragment order (16-bit inputs, and int8 codes in their own order): the block without
    its input PRMTs gives, lane for lane, the bits the shipped block gives on natural-order inputs."""
    ops, memories, n_out, _, _ = _case(dt, rows, tiles, shared, seed=11)
    ops_f, memories_f, _, _, _ = _case(dt, rows, tiles, shared, seed=11, fragment_order=True)
    asm = mg.block_asm(dt, rows, tiles, shared, fragment_order=True)
    assert "prmt" not in asm and asm.count("mma.sync") == mg.block_asm(dt, rows, tiles, shared).count("mma.sync")
    got = run(asm, ops_f, memories_f, n_out)
    want = run(mg.block_asm(dt, rows, tiles, shared), ops, memories, n_out)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_fragment_order_is_the_nibble_pairs_order():
    """16-bit inputs pair a word's nibbles i and i + 4 (one LOP3 each); int8 codes take its even nibbles, then
    its odd ones (the int8 block's two ANDs)."""
    x = torch.arange(2 * 16).reshape(2, 16)
    f = mg.to_fragment_order(x)
    assert f[0, :8].tolist() == [0, 4, 1, 5, 2, 6, 3, 7] and f[1, 8:].tolist() == [24, 28, 25, 29, 26, 30, 27, 31]
    assert torch.equal(mg.from_fragment_order(f), x)
    c = x.to(torch.int8)
    fc = mg.to_fragment_order(c)
    assert fc[0, :8].tolist() == [0, 2, 4, 6, 1, 3, 5, 7] and fc[1, 8:].tolist() == [24, 26, 28, 30, 25, 27, 29, 31]
    assert torch.equal(mg.from_fragment_order(fc), c)
    with pytest.raises(ValueError):
        mg.block_asm("s8", 16, 1, fragment_order=True, dequant=True)


@pytest.mark.parametrize("dt,rows,tiles,fragment_order", [(dt, rows, tiles, f) for dt, rows, tiles, _ in CASES
                                                        if not _ for f in (False, True)])
def test_x_tile_block_gives_the_same_bits(dt, rows, tiles, fragment_order):
    """Inputs in `to_x_tiles`' layout (each chunk load of the warp reads 512 contiguous bytes): the block
    gives, lane for lane, the bits the shipped block gives on natural-order inputs."""
    ops, memories, n_out, _, _ = _case(dt, rows, tiles, False, seed=13)
    ops_t, memories_t, _, _, _ = _case(dt, rows, tiles, False, seed=13, fragment_order=fragment_order, x_tiles=True)
    asm = mg.block_asm(dt, rows, tiles, x_tiles=True, fragment_order=fragment_order)
    assert "+512]" in asm and "+16]" not in asm
    got = run(asm, ops_t, memories_t, n_out)
    want = run(mg.block_asm(dt, rows, tiles), ops, memories, n_out)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("dtype,m", [(torch.bfloat16, 1), (torch.bfloat16, 13), (torch.int8, 8), (torch.int8, 40),
                                     (torch.float16, 16)])
def test_x_tiles_layout(dtype, m):
    """Lane (g, t)'s chunk j of a tile's block b sits at 512 j + 16 (4 g + t) bytes from the block's start
    and holds token g's columns 32 t + e j ... (e elements per 16 bytes), 16-bit ones in fragment order unless
    told otherwise; padding repeats the last token."""
    k = 256
    x = (torch.arange(m * k) % 127).reshape(m, k).to(dtype)
    sixteen = dtype != torch.int8
    assert sixteen == mg.tiles_in_fragment_order(dtype)
    # in fragment order the layout is the natural-chunk tiles of the columns in that order
    nat, frag = mg.to_x_tiles(x, fragment_order=False), mg.to_x_tiles(x, fragment_order=True)
    assert torch.equal(frag, mg.to_x_tiles(mg.to_fragment_order(x), fragment_order=False))
    assert torch.equal(mg.from_x_tiles(nat, m, fragment_order=False), x)
    assert torch.equal(mg.from_x_tiles(frag, m, fragment_order=True), x)
    xt = mg.to_x_tiles(x)
    rows = mg.x_tile_rows(m)
    assert xt.shape == (rows, k) and rows % 8 == 0 and (m <= 8 or rows % 16 == 0)
    assert torch.equal(mg.from_x_tiles(xt, m), x)
    e = 16 // x.element_size()
    flat = xt.reshape(-1)
    xp = torch.cat([x, x[-1:].expand(rows - m, k)])
    if sixteen:
        xp = mg.to_fragment_order(xp)
    for tile, b, j, g, t in itertools.product(range(rows // 8), range(k // 128), range(128 // 4 // e), range(8),
                                              range(4)):
        at = (tile * (k // 128) + b) * 8 * 128 + (j * 32 + 4 * g + t) * e
        assert torch.equal(flat[at: at + e], xp[8 * tile + g, 128 * b + 32 * t + e * j: 128 * b + 32 * t + e * (j + 1)])
    with pytest.raises(ValueError):
        mg.block_asm("bf16", 16, 1, shared=True, x_tiles=True)
