"""The blocks16 int4 layout (quant/int4.py): same weights, other byte order; every kernel that reads
it must give the bits the row layout gives, and every kernel that does not must say so."""

from __future__ import annotations

import os

import pytest
import torch

from gearshift.kernels.config import TileConfig
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.int4 import (BLOCKS16, ROWS, Int4Weight, blocks16_from_rows, quantize_int4,
                                  rows_from_blocks16)

INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
kernels = pytest.mark.skipif(not (INTERP or torch.cuda.is_available()), reason="needs TRITON_INTERPRET=1 or a GPU")


def _pair(n=48, k=512, g=128, seed=0):
    torch.manual_seed(seed)
    rows = quantize_int4(torch.randn(n, k), g).to(DEV)
    return rows, rows.to_layout(BLOCKS16)


def test_layout_is_a_byte_permutation_with_the_documented_address():
    rows, blk = _pair(48, 384)
    assert blk.layout == BLOCKS16 and blk.qweight.shape == rows.qweight.shape
    assert torch.equal(rows_from_blocks16(blk.qweight), rows.qweight)
    assert torch.equal(blk.unpacked(), rows.unpacked()) and torch.equal(blk.dequantize(), rows.dequantize())
    flat, k = blk.qweight.flatten(), 384
    for n, j in ((0, 0), (5, 63), (17, 64), (47, 191), (33, 130)):
        assert flat[(n // 16 * (k // 128) + j // 64) * 1024 + n % 16 * 64 + j % 64] == rows.qweight[n, j]
    # a warp's 16-byte loads (lane 4g + t: row g, bytes 16t..16t+15 of the block) are 512 contiguous bytes
    lanes = torch.cat([rows.qweight[g, 64 + 16 * t:64 + 16 * t + 16] for g in range(8) for t in range(4)])
    assert torch.equal(flat[1024:1536], lanes)
    assert blk.to_layout(BLOCKS16) is blk and torch.equal(blk.to_layout(ROWS).qweight, rows.qweight)


def test_layout_rejects_shapes_it_cannot_tile():
    with pytest.raises(ValueError, match="N % 16"):
        blocks16_from_rows(torch.zeros(40, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="N % 16"):
        quantize_int4(torch.randn(24, 256), 128).to_layout(BLOCKS16)
    with pytest.raises(ValueError, match="unknown int4 layout"):
        st = quantize_int4(torch.randn(16, 128), 128)
        Int4Weight(st.qweight, st.scales, st.mins, 128, layout="cols")


def test_layout_survives_state_round_trip():
    _, blk = _pair()
    back = Int4Weight.from_state({"qweight": blk.qweight, "scales": blk.scales, "mins": blk.mins}, blk.meta())
    assert back.layout == BLOCKS16 and torch.equal(back.dequantize(), blk.dequantize())
    assert "layout" not in quantize_int4(torch.randn(16, 128), 128).meta()  # old checkpoints stay as they were


@kernels
@pytest.mark.parametrize("cfg", [TileConfig(16, 32, 128, 1, 4, 2, True, True),
                                 TileConfig(16, 32, 64, 2, 4, 2, True, False),
                                 TileConfig(16, 16, 32, 1, 4, 2, False, True),
                                 TileConfig(32, 64, 256, 2, 4, 2, False, True)], ids=lambda c: c.key())
def test_w4a16_tiles_read_both_layouts_alike(cfg):
    from gearshift.kernels.w4a16 import supports, w4a16_linear

    rows, blk = _pair(48, 512, 256, seed=1)
    assert supports(blk, cfg)
    x = torch.randn(5, 512, device=DEV).half()
    assert torch.equal(w4a16_linear(x, blk, cfg), w4a16_linear(x, rows, cfg))


@kernels
@pytest.mark.parametrize("join", [True, False])
def test_w4a8_reads_both_layouts_alike(join):
    from gearshift.kernels.w4a8 import w4a8_linear

    rows, blk = _pair(32, 512, 128, seed=2)
    act = ActQuantSpec("int8")
    x = torch.randn(3, 512, device=DEV).half()
    cfg = TileConfig(16, 16, 128, 2, 4, 2, True, join)
    assert torch.equal(w4a8_linear(x, blk, act, cfg), w4a8_linear(x, rows, act, cfg))


@kernels
def test_dequant_reads_blocks16():
    from gearshift.kernels.dequant import dequant_int4_triton

    rows, blk = _pair(48, 512, 64, seed=3)
    assert torch.equal(dequant_int4_triton(blk, torch.float16), rows.dequantize(torch.float16))


@kernels
def test_row_only_kernels_refuse_blocks16():
    from gearshift.dispatch.strategies import STRATEGIES
    from gearshift.kernels.int4_gemv import int4_gemv, int4_gemv_supports
    from gearshift.kernels.w4a16 import w4a16_gemv
    from gearshift.kernels.w4a16_rowgemv import rowgemv_supports, w4a16_rowgemv

    _, blk = _pair(32, 512)
    x = torch.randn(1, 512, device=DEV).half()
    for call in (lambda: int4_gemv(x, blk, TileConfig(1, 16, 128, 1, 4, 1)),
                 lambda: w4a16_gemv(x, blk, TileConfig(1, 16, 128, 1, 4, 2)),
                 lambda: w4a16_rowgemv(x, blk)):
        with pytest.raises(ValueError, match="row int4 layout"):
            call()
    assert not int4_gemv_supports(blk, TileConfig(1, 16, 128, 1, 4, 1)) and not rowgemv_supports(blk, 512)
    assert not STRATEGIES["w4a16_gemv"].supports(blk, None, TileConfig(4, 32, 128, 2, 4, 2))
    assert STRATEGIES["w4a16_tc"].supports(blk, None, TileConfig(16, 32, 128, 1, 4, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (inline PTX)")
@pytest.mark.parametrize("m", [1, 5, 16])
def test_fragment_kernel_reads_both_layouts_alike(m):
    from gearshift.kernels.int4_mma_gemv import mma_gemv

    rows, blk = _pair(4096, 4096, 128, seed=4)
    x = torch.randn(m, 4096, device=DEV, dtype=torch.bfloat16)
    for cfg in (TileConfig(16, 0, 128, 4, 4, 1), TileConfig(8, 0, 128, 8, 4, 1),
                TileConfig(16, 0, 128, 2, 2, 1, prefetch=True)):
        assert torch.equal(mma_gemv(x, blk, cfg), mma_gemv(x, rows, cfg))
