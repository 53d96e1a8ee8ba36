"""Activation buffers of whole token tiles: the rows past a linear's input that the wgmma kernels' TMA boxes read.

Why: a TMA box of which many rows lie past its tensor reads slowly (stop 71), and padding x with zero rows is a copy
of the whole input (`pad_rows`; 1-2 us a linear, 12 at 513 tokens of down's 14336 columns). The producers of the
linears' inputs (the RMSNorms, SwiGLU, the activation quantizer, attention) therefore allocate their rows at the start
of a buffer of whole tiles (`empty_rows`), and the kernels read the further rows from there in place (`whole_tiles`).
Those rows hold whatever the buffer held (NaN included): they feed only outputs that are never stored, since every
output row of these GEMMs depends on its own token row alone. The switch `tile_room` turns both off.

H200, stop 72: the W4A16 picks' linears of a layer 184.4 us at 129 tokens against 197.5 with the copy rule and 278
as they were (`partial_tiles.py`), 529 against 568 at 513 tokens; graphed prefills (`tile_room_ab.py`, the same
logits) 0.952-0.959 of exact rows at 48-384 rows (W4A16) and 0.95-0.96 at 384 (W4A8).
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import next_pow2
from gearshift.kernels.pad_rows import pad_rows
from gearshift.kernels.switches import tile_room_on

#: inputs of at most this many rows get no room (the fragment kernels that run them read no TMA token tiles)
ROOM_FROM = 16
#: the largest token tile (BM) of the wgmma kernels
ROOM_TILE = 256


def rows_in_storage(x2: torch.Tensor, rows: int) -> torch.Tensor | None:
    """x2's first `rows` rows (x2's row stride, unit column stride) as a view of its storage, where that storage
    holds them; the rows past x2 hold whatever the storage holds there (they may be NaN), so only a consumer whose
    outputs of those rows are never used may read them. None where the storage ends before, or the switch is off."""
    m, k = x2.shape
    if rows <= m or not tile_room_on() or x2.stride(1) != 1 or m == 0:
        return None
    end = x2.storage_offset() + (rows - 1) * x2.stride(0) + k
    if end * x2.element_size() > x2.untyped_storage().nbytes():
        return None
    return x2.as_strided((rows, k), x2.stride())


def whole_tiles(x2: torch.Tensor, bm: int, copy: bool) -> torch.Tensor:
    """x2 with its rows up to a multiple of bm: from its storage where that has room (free), else, where `copy`,
    as zero rows appended by `pad_rows`; else x2 as it is. The rows past x2 are for TMA boxes only: consumers
    must never store the outputs they feed."""
    m = x2.shape[0]
    rows = m + (-m % bm)
    if rows == m:
        return x2
    view = rows_in_storage(x2, rows)
    if view is not None:
        return view
    return pad_rows(x2, rows) if copy else x2


def room_rows(m: int) -> int:
    """Rows of the buffer that `empty_rows` puts m rows in: m up to ROOM_FROM, else m up to a multiple of the
    smaller of ROOM_TILE and the power of two at or above m (a map bucket's tiles are no taller than the bucket)."""
    if m <= ROOM_FROM or not tile_room_on():
        return m
    tile = min(ROOM_TILE, next_pow2(m))
    return m + (-m % tile)


def empty_rows(m: int, cols: int, dtype: torch.dtype, device) -> torch.Tensor:
    """torch.empty((m, cols)) at the start of a buffer of `room_rows(m)` rows."""
    full = room_rows(m)
    buf = torch.empty((full, cols), dtype=dtype, device=device)
    return buf if full == m else buf[:m]
