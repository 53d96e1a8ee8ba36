"""The deterministic split-K epilogue shared by the wgmma kernels (`w4a16_wgmma._store_tile`): the
last slice to arrive sums every slice's partial, 32 tokens at a time since stop 26. Checked on the
split-K tiles of each kernel family, with token counts that end inside a 32-token chunk: the same
result as each kernel's torch model, and the same bits on every run (Hopper GPU)."""

from __future__ import annotations

import pytest
import torch

from gearshift.dispatch.profiler import random_store
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.int4 import BLOCKS16
from hopper import needs_hopper  # tests/hopper.py


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@needs_hopper
@pytest.mark.parametrize("m", [37, 100, 300])
def test_w4a16_wgmma_split_k(m):
    from gearshift.kernels.w4a16_wgmma import w4a16_wgmma, w4a16_wgmma_emulate, wgmma_configs, wgmma_supports

    torch.manual_seed(0)
    st = random_store("int4", 512, 2048, 128, "cuda", layout=BLOCKS16)
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    emu = w4a16_wgmma_emulate(x, st).float()
    cfgs = [c for c in wgmma_configs(max(m, 64)) if c.split_k > 1 and wgmma_supports(st, c)]
    assert cfgs
    for cfg in cfgs:
        y = w4a16_wgmma(x, st, cfg)
        assert _rel(y, emu) < 1e-3, cfg
        assert torch.equal(y, w4a16_wgmma(x, st, cfg)), cfg


@needs_hopper
@pytest.mark.parametrize("m", [37, 100, 300])
def test_w4a8_progressive_split_k(m):
    from gearshift.kernels.act_quant import quantize_act_triton
    from gearshift.kernels.w4a8_progressive import (progressive_codes, progressive_configs, progressive_supports,
                                                    w4a8_progressive_emulate)

    torch.manual_seed(0)
    act = ActQuantSpec("int8")
    st = random_store("int4p", 512, 2048, 128, "cuda", layout=BLOCKS16)
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    codes, scales = quantize_act_triton(x, act)
    cfgs = [c for c in progressive_configs(max(m, 64)) if c.split_k > 1 and progressive_supports(st, act, c)]
    assert cfgs
    for cfg in cfgs:
        emu = w4a8_progressive_emulate(codes, scales, st, torch.float32, cfg.split_k, cfg)
        y = progressive_codes(codes, scales, st, cfg, torch.float32)
        assert torch.equal(y, emu), (cfg, _rel(y, emu))


@needs_hopper
@pytest.mark.parametrize("m", [13, 29])
def test_w4a16_wgmma_small_split_k(m):
    from gearshift.kernels.w4a16_wgmma_small import (small_configs, small_supports, w4a16_wgmma_small,
                                                     w4a16_wgmma_small_emulate)

    torch.manual_seed(0)
    st = random_store("int4", 512, 2048, 128, "cuda", layout=BLOCKS16)
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    emu = w4a16_wgmma_small_emulate(x, st).float()
    cfgs = [c for c in small_configs(m) if c.split_k > 1 and small_supports(st, c, x.dtype)]
    assert cfgs
    for cfg in cfgs:
        y = w4a16_wgmma_small(x, st, cfg)
        assert _rel(y, emu) < 4e-3, cfg
        assert torch.equal(y, w4a16_wgmma_small(x, st, cfg)), cfg


def test_outgrown_counter_buffers_stay_alive():
    """A larger request gets a new zeroed buffer (twice the old size at least) and the old one is kept:
    CUDA graphs captured with it still count in it (freeing it let replays write into memory other
    tensors had been given, stop 48)."""
    from gearshift.kernels import splitk

    name = "test_outgrown"
    small = splitk.zeroed_words(name, torch.device("cpu"), 10)
    assert splitk.zeroed_words(name, torch.device("cpu"), 8) is small  # fits: the same buffer
    big = splitk.zeroed_words(name, torch.device("cpu"), 12)
    assert big is not small and big.numel() >= 20 and not big.any()
    assert any(t is small for t in splitk._OUTGROWN)
