"""Tile bookkeeping shared by the swap-AB `tl.dot` kernels (w4a16, w4a8, w8): which output tile
a program owns, which K tiles its split-K slice covers, and the epilogue that stores (or, with
split-K, reduces) the [BN, BM] fp32 tile into y [M, N]."""

from __future__ import annotations

from gearshift.kernels._triton import HAS_TRITON, tl, triton
from gearshift.kernels.splitk import splitk_buffers
from gearshift.quant.int4 import ROWS, Int4Weight


def blocks_fit(store: Int4Weight, bk: int) -> bool:
    """The blocks16 layout needs K tiles that never split a 64-byte piece (`w_tile_offset`)."""
    return store.layout == ROWS or 128 % bk == 0 or bk % 128 == 0


def rows_only(store: Int4Weight, name: str) -> None:
    """Kernels that read the row layout only say so instead of reading the wrong bytes."""
    if store.layout != ROWS:
        raise ValueError(f"{name} reads the row int4 layout; this store is {store.layout} "
                         f"(Int4Weight.to_layout('rows') converts it)")

if HAS_TRITON:
    from gearshift.kernels.splitk import splitk_finish

    @triton.jit
    def tile_offsets(N, M, BN: tl.constexpr, BM: tl.constexpr, GROUP: tl.constexpr = 8):
        """Grid axes 0/1 -> this program's output rows (N) and tokens (M), with their masks.
        Launch order walks GROUP token tiles per weight tile before moving on, so a weight tile is
        reused from L2 by GROUP neighbours (measured ~1.1-1.5x at M >= 1024 on the H100); with
        one token tile it is the identity."""
        pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        n_tiles = tl.num_programs(0)
        per_group = GROUP * n_tiles
        first_m = (pid // per_group) * GROUP
        gsize = tl.minimum(tl.num_programs(1) - first_m, GROUP)
        pid_m = first_m + (pid % per_group) % gsize
        pid_n = (pid % per_group) // gsize
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_m = pid_m * BM + tl.arange(0, BM)
        return offs_n, offs_m, offs_n < N, offs_m < M


    @triton.jit
    def k_tile_range(pid_k, K, BK: tl.constexpr, SPLIT_K: tl.constexpr):
        """K tiles [t0, t1) of split-K slice pid_k (K // BK tiles shared out over SPLIT_K slices)."""
        kt = K // BK
        tps = tl.cdiv(kt, SPLIT_K)
        t0 = pid_k * tps
        return t0, tl.minimum(t0 + tps, kt)


    @triton.jit
    def int4_tile_pointers(x_ptr, qw_ptr, s_ptr, mn_ptr, offs_n, offs_m, K, stride_xm, G: tl.constexpr,
                           BK: tl.constexpr, BLOCKS: tl.constexpr):
        """Int4 store tile pointers at k = 0: packed weights [BN, BK/2] (row layout [N, K//2], or
        BLOCKS: `quant.int4.blocks16_from_rows`; advance by `w_tile_offset`), x's even columns
        [BK/2, BM] (odd = +1), x contiguous [BK, BM], and the per-row scale / min group bases."""
        offs_h = tl.arange(0, BK // 2)
        n_groups = K // G
        if BLOCKS:  # byte (n, j) at (n // 16 * K/128 + j // 64) * 1024 + n % 16 * 64 + j % 64
            if BK <= 128:  # within one 64-byte piece (plain offs_h keeps Triton 3.6's 16-byte loads)
                h_off = offs_h
            else:
                h_off = (offs_h // 64) * 1024 + offs_h % 64
            w_ptrs = qw_ptr + blocks16_row_offset(offs_n, K)[:, None] + h_off[None, :]
        else:
            w_ptrs = qw_ptr + offs_n[:, None] * (K // 2) + offs_h[None, :]
        x_ptrs = x_ptr + offs_m[None, :] * stride_xm + 2 * offs_h[:, None]
        xk_ptrs = x_ptr + offs_m[None, :] * stride_xm + tl.arange(0, BK)[:, None]
        return w_ptrs, x_ptrs, xk_ptrs, s_ptr + offs_n * n_groups, mn_ptr + offs_n * n_groups


    @triton.jit
    def blocks16_row_offset(offs_n, K):
        """Byte offset of row n's first 64-byte piece in the blocks16 layout (`quant.int4`)."""
        return (offs_n // 16) * (8 * K) + (offs_n % 16) * 64


    @triton.jit
    def w_tile_offset(k0, BK: tl.constexpr, BLOCKS: tl.constexpr):
        """Bytes from the k = 0 weight pointers to K tile k0 (k0 a multiple of BK; in the blocks16
        layout BK must divide 128 or be a multiple of it, so a tile never splits a 64-byte piece).
        Written so that Triton sees the offset's alignment (BK/2 bytes) and keeps wide loads."""
        if BLOCKS:
            if BK >= 128:
                return (k0 // 128) * 1024
            return (k0 // 128) * 1024 + ((k0 // BK) % (128 // BK)) * (BK // 2)
        return k0 // 2


    @triton.jit
    def group_scales(sc_ptrs, mn_ptrs, k0, n_mask, G: tl.constexpr):
        """Scale / min per row (storage dtype) of the group holding column k0. The K loops load
        the next tile's pair one iteration ahead: loaded where used, this latency stalled every
        iteration (these small loads are not pipelined by Triton)."""
        g = k0 // G
        return tl.load(sc_ptrs + g, mask=n_mask, other=0.0), tl.load(mn_ptrs + g, mask=n_mask, other=0.0)


    @triton.jit
    def scales_ahead(sc_ptrs, mn_ptrs, sc_n, mn_n, k0, K, n_mask, G: tl.constexpr, BK: tl.constexpr):
        """K tile k0's scale / min in fp32 (sc_n / mn_n, loaded an iteration earlier) and the raw
        pair of tile k0 + BK (the last tile re-reads its own)."""
        nxt_sc, nxt_mn = group_scales(sc_ptrs, mn_ptrs, tl.minimum(k0 + BK, K - BK), n_mask, G)
        return sc_n.to(tl.float32), mn_n.to(tl.float32), nxt_sc, nxt_mn


    @triton.jit
    def store_tile(y_ptr, acc, offs_n, offs_m, n_mask, m_mask, M, N, stride_ym, ws_ptr, cnt_ptr,
                   SPLIT_K: tl.constexpr):
        """acc [BN, BM] (fp32) -> y [M, N] in y's dtype. With split-K the slices meet in the
        deterministic one-launch reduction of `splitk.py` (workspace [SPLIT_K, M*N], one arrival
        counter per output tile): no zero-fill or cast launches, and the same bits on every run,
        which fp32 atomics did not give."""
        y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
        mask = n_mask[:, None] & m_mask[None, :]
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        splitk_finish(acc, y_ptrs, ws_ptr, cnt_ptr, offs_m[None, :] * N + offs_n[:, None], mask, tile,
                      tl.program_id(2), M * N, SPLIT_K)


def tile_buffers(y, split_k: int, grid: tuple[int, int, int]):
    """(workspace, counters) for `store_tile` into y [M, N] over this launch grid."""
    return splitk_buffers(y, split_k, y.shape[0] * y.shape[1], grid[0] * grid[1])
