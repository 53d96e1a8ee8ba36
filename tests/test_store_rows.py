"""The row-contiguous epilogue store of the wgmma kernels (`w4a16_wgmma.store_rows`, stop 27): a
finished tile goes out as 16-byte stores of 8 weight rows instead of from the wgmma layout, and
`w4a8_progressive`'s 256-token tiles round both token halves before either store. Only the store
changes, so every tile must give the bits of the wgmma-layout store, on token counts that end
inside a tile, and the progressive tiles their torch model's bits (Hopper GPU)."""

from __future__ import annotations

import pytest
import torch

from gearshift.dispatch.profiler import random_store
from gearshift.kernels.config import TileConfig
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.int4 import BLOCKS16
from hopper import needs_hopper  # tests/hopper.py

#: the map's kinds of W4A16 tile: two consumers (256 x 128, 128 x 128), one (128 x 64, 64 x 64),
#: split-K (the finisher's store is untouched, the rest must still agree), stream-K
W16_TILES = [TileConfig(256, 128, 128, 1, 8, 3), TileConfig(128, 128, 128, 1, 8, 3),
             TileConfig(128, 64, 128, 1, 4, 3, maxnreg=128), TileConfig(64, 64, 128, 1, 4, 4, maxnreg=80),
             TileConfig(256, 128, 128, 2, 8, 3), TileConfig(128, 64, 128, 1, 4, 3, maxnreg=128, stream_k=2),
             TileConfig(256, 128, 128, 1, 8, 3, stream_k=1)]
#: and of W4A8 (int4-prog) tile: 256 tokens in two halves (with 128 or 64 rows, 3-5 stages), 128 / 64
#: tokens, BN = 256, split-K and stream-K
PROG_TILES = [TileConfig(256, 128, 128, 1, 8, 3), TileConfig(256, 128, 128, 1, 8, 4), TileConfig(256, 64, 128, 1, 4, 5),
              TileConfig(128, 128, 128, 1, 8, 4), TileConfig(128, 256, 128, 1, 8, 4),
              TileConfig(64, 64, 128, 1, 4, 6, maxnreg=128), TileConfig(256, 128, 128, 2, 8, 3),
              TileConfig(256, 128, 128, 1, 8, 3, stream_k=1), TileConfig(128, 64, 128, 1, 4, 4, stream_k=1)]


@needs_hopper
@pytest.mark.parametrize("kind", ["int4", "int4p"])
def test_w4a16_wgmma_store_rows(kind, monkeypatch):
    from gearshift.kernels import w4a16_wgmma as W

    torch.manual_seed(0)
    st = random_store(kind, 512, 2048, 128, "cuda", layout=BLOCKS16)
    for m in (77, 300):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        for cfg in W16_TILES:
            assert W.wgmma_supports(st, cfg), cfg
            monkeypatch.setattr(W, "WGMMA_VEC_STORE", False)
            ref = W.w4a16_wgmma(x, st, cfg)
            monkeypatch.setattr(W, "WGMMA_VEC_STORE", True)
            assert torch.equal(W.w4a16_wgmma(x, st, cfg), ref), (kind, m, cfg)


@needs_hopper
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_w4a8_progressive_store_rows(out_dtype, monkeypatch):
    from gearshift.kernels import w4a8_progressive as P
    from gearshift.kernels.act_quant import quantize_act_triton

    torch.manual_seed(0)
    st = random_store("int4p", 512, 2048, 128, "cuda", layout=BLOCKS16)
    act = ActQuantSpec("int8")
    for m in (77, 300):
        codes, scales = quantize_act_triton(torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16), act)
        for cfg in PROG_TILES:
            assert P.progressive_supports(st, act, cfg), cfg
            monkeypatch.setattr(P, "PROGRESSIVE_VEC_STORE", False)
            ref = P.progressive_codes(codes, scales, st, cfg, out_dtype)
            monkeypatch.setattr(P, "PROGRESSIVE_VEC_STORE", True)
            y = P.progressive_codes(codes, scales, st, cfg, out_dtype)
            assert torch.equal(y, ref), (m, cfg)
            if out_dtype == torch.float32:  # the torch model's bits (fp32 out: no final rounding to hide in)
                emu = P.w4a8_progressive_emulate(codes, scales, st, torch.float32, cfg.split_k, cfg)
                assert torch.equal(y, emu), (m, cfg)


@needs_hopper
def test_small_and_int8_wgmma_store_rows(monkeypatch):
    """The few-token kernel (16 / 32 tokens) and the int8 kernel of plain int4 stores share the
    switch (`WGMMA_VEC_STORE`) and must not change a bit either."""
    from gearshift.kernels import w4a16_wgmma as W
    from gearshift.kernels.w4a16_wgmma_small import small_configs, small_supports, w4a16_wgmma_small
    from gearshift.kernels.w4a8_wgmma import int8_wgmma_configs, int8_wgmma_supports, w4a8_int8_wgmma

    torch.manual_seed(0)
    st = random_store("int4", 512, 2048, 128, "cuda", layout=BLOCKS16)
    act = ActQuantSpec("int8")

    def same(run, cfg):
        monkeypatch.setattr(W, "WGMMA_VEC_STORE", False)
        ref = run(cfg)
        monkeypatch.setattr(W, "WGMMA_VEC_STORE", True)
        assert torch.equal(run(cfg), ref), cfg

    for m in (13, 30):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        cfgs = [c for c in small_configs(m) if small_supports(st, c, x.dtype)][:6]
        assert cfgs
        for cfg in cfgs:
            same(lambda c: w4a16_wgmma_small(x, st, c), cfg)
    for m in (77, 300):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        cfgs = [c for c in int8_wgmma_configs(m) if int8_wgmma_supports(st, act, c)][:6]
        assert cfgs
        for cfg in cfgs:
            same(lambda c: w4a8_int8_wgmma(x, st, act, c), cfg)
