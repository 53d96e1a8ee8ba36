"""The fragment kernel's input tiles: activations stored the way its lanes load them.

Why: a warp of the fragment kernel (`int4_mma_gemv`) loads 16 bytes per lane of each of 8 token rows at
once. In row order one such load gathers 16-byte pieces of 8 rows (16 cache lines, half of every 32-byte
sector), and at 9..16 tokens those loads keep the L1/TEX unit busier than DRAM (stop 46's counters: 79%
of its peak on gate_up's 16-token tile, DRAM at 55%). In this layout each load of a warp reads 512
contiguous bytes: per 8-token tile and 128-column block, chunk j of lane (g, t), its 16 bytes of token
g's columns 32 t + (16 / size) j ..., sits at 512 j + 16 (4 g + t) bytes. 16-bit inputs are also in
fragment order inside each chunk (`FRAGMENT_ORDER`), so each input register already is an MMA operand and
the block's input PRMTs go (stop 65: 0.93 of the 16-token linears in natural chunk order, H200). The
producer of a linear's input (RMSNorm, decode attention, gate_up's SwiGLU epilogue) writes it there when
the linear's kernel asks (`XTiles`); the values and the kernel's results are the same bits as in row order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gearshift.kernels._triton import HAS_TRITON, tl, triton  # noqa: F401  (tl: the interpreter wants it here)

BLOCK_COLS = 128  # columns of one fragment block (the kernel's `BLOCK_COLS`)
#: bytes one chunk load of a warp reads (32 lanes x 16 bytes)
X_TILE_CHUNK = 512
#: token counts the layout serves (a fragment program reads one or two 8-token tiles). Which of them the engine's
#: producers write it for is `switches.x_tiles_on`'s (all since stop 66; from 3 in stop 65)
X_TILE_TOKENS = range(1, 17)
#: column order of every 8 in fragment order: position p holds natural column FRAGMENT_ORDER[p] (the pairs
#: one weight word's LOP3s make)
FRAGMENT_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
#: the same for int8 codes (stop 69): a weight word's even nibbles, then its odd ones (the int8 block's two ANDs),
#: so each 4-byte input register already is an `m16n8k32` B operand
S8_FRAGMENT_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def fragment_order_of(dtype: torch.dtype) -> tuple[int, ...]:
    """The column order of every 8 that the block for dtype reads without input PRMTs."""
    return S8_FRAGMENT_ORDER if dtype == torch.int8 else FRAGMENT_ORDER


def _reorder_eights(x: torch.Tensor, order) -> torch.Tensor:
    """x [..., K] with position p of every 8 columns taking column order[p] (a copy)."""
    return x.reshape(*x.shape[:-1], x.shape[-1] // 8, 8)[..., list(order)].reshape(x.shape)


def to_fragment_order(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] with each 8 columns' values in `fragment_order_of(x.dtype)`: what `mma_gemv(...,
    fragment_order=True)` reads (a copy)."""
    return _reorder_eights(x, fragment_order_of(x.dtype))


def from_fragment_order(x: torch.Tensor) -> torch.Tensor:
    """The inverse of `to_fragment_order`."""
    order = fragment_order_of(x.dtype)
    return _reorder_eights(x, [order.index(c) for c in range(8)])


def tiles_in_fragment_order(dtype: torch.dtype, fragment_order: bool | None = None) -> bool:
    """Whether x tiles of dtype hold their chunks in fragment order: 16-bit inputs do unless told not to
    (an ablation's natural chunk order); int8 codes only when told to (no producer writes them so yet)."""
    sixteen = dtype in (torch.bfloat16, torch.float16)
    return sixteen if fragment_order is None else fragment_order


def x_tile_rows(m: int) -> int:
    """Token rows of the layout for m tokens: whole 8-token tiles, and from 9 tokens whole 16-token
    programs (each reads two tiles)."""
    return 8 * -(-m // 8) if m <= 8 else 16 * -(-m // 16)


def to_x_tiles(x: torch.Tensor, fragment_order: bool | None = None) -> torch.Tensor:
    """x [M, K] (16-bit inputs or int8 codes) in the layout, a copy of [`x_tile_rows(M)`, K] elements.
    The padding rows repeat token M - 1; the kernel never reads them (an absent token's lanes read token
    M - 1's place), so the producers leave them unwritten.
    fragment_order: `tiles_in_fragment_order`'s (default: the layout's own)."""
    m, k = x.shape
    if k % BLOCK_COLS:
        raise ValueError(f"x-tile inputs need K a multiple of {BLOCK_COLS}; got {k}")
    if tiles_in_fragment_order(x.dtype, fragment_order):
        x = to_fragment_order(x)
    e = 16 // x.element_size()  # elements per 16-byte chunk
    t = x_tile_rows(m) // 8
    xp = torch.cat([x, x[-1:].expand(8 * t - m, k)]) if 8 * t > m else x
    v = xp.reshape(t, 8, k // BLOCK_COLS, 4, BLOCK_COLS // 4 // e, e)  # (tile, g, block, lane t, chunk j, e)
    return v.permute(0, 2, 4, 1, 3, 5).contiguous().reshape(8 * t, k)


def from_x_tiles(xt: torch.Tensor, m: int, fragment_order: bool | None = None) -> torch.Tensor:
    """The inverse of `to_x_tiles` for its first m tokens."""
    k = xt.shape[1]
    e = 16 // xt.element_size()
    t = xt.shape[0] // 8
    v = xt.reshape(t, k // BLOCK_COLS, BLOCK_COLS // 4 // e, 8, 4, e).permute(0, 3, 1, 4, 2, 5)
    x = v.reshape(8 * t, k)[:m]
    return from_fragment_order(x) if tiles_in_fragment_order(xt.dtype, fragment_order) else x


@dataclass
class XTiles:
    """Activations a producer stored in the layout because the next linear's kernel takes it
    (`QuantLinear.x_tiles_for`): data [`x_tile_rows(M)`, K], and the shape and dtype they stand for."""
    data: torch.Tensor
    shape: tuple[int, ...]

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def is_cuda(self) -> bool:
        return self.data.is_cuda

    @property
    def tokens(self) -> int:
        return math.prod(self.shape[:-1])

    def rows(self) -> torch.Tensor:
        """The activations in row order, [*shape] (a copy: for kernels and hooks that want them so)."""
        return from_x_tiles(self.data, self.tokens).reshape(self.shape)


if HAS_TRITON:
    @triton.jit
    def s8_fragment_permute(q, FO: tl.constexpr):
        """q [B] (codes of B consecutive columns, B a multiple of 8 starting at one) in `S8_FRAGMENT_ORDER` (FO;
        each 8's even columns, then its odd ones, for the fragment kernel's int8 block), else as it is. A register
        permutation, so the producer's stores stay contiguous and vectorized (stop 69: storing at permuted offsets
        made them byte stores, and a one-sequence W4A8 decode step 3.4% slower)."""
        if FO:
            n: tl.constexpr = q.shape[0]
            return tl.reshape(tl.permute(tl.reshape(q, (n // 8, 4, 2)), (0, 2, 1)), (n,))
        return q

    @triton.jit
    def x_tile_offsets(tok, col, NB):
        """Element offsets of (token, column) in the layout of 16-bit inputs, NB = K / 128 blocks per row (natural
        column c of each 8 at position 2 (c % 4) + c // 4: `FRAGMENT_ORDER`)."""
        block = (tok // 8) * NB + col // 128
        return (block * 1024 + ((col % 32) // 8) * 256 + (tok % 8) * 32 + ((col % 128) // 32) * 8
                + 2 * (col % 4) + (col % 8) // 4)
