"""The few-token scale-after wgmma kernel (`kernels/w4a16_wgmma_small.py`).

On CPU: its torch model against the reference (plain and with activation codes), the support
rules, the strategies' registration, and sm_90 compiles (wgmma with the token count as N, TMA,
the byte widening without a per-weight FMA). On a Hopper GPU: the kernel against its model and
the reference, and split-K bit-reproducibility.
"""

from __future__ import annotations

import pytest
import torch

from gearshift.dispatch.profiler import random_store
from gearshift.kernels.act_quant import quantize_act_reference
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.w4a16_wgmma_small import (HAS_GLUON, consumer_regs, small_configs, small_supports,
                                                 w4a16_wgmma_small_emulate)
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.int4 import BLOCKS16, ROWS

from hopper import needs_hopper  # tests/hopper.py

pytestmark = pytest.mark.skipif(not HAS_GLUON, reason="this Triton has no Gluon")


def test_emulation_is_the_reference():
    torch.manual_seed(0)
    st = random_store("int4", 96, 1024, 128, "cpu")
    x = torch.randn(13, 1024, dtype=torch.float64).float()
    emu = w4a16_wgmma_small_emulate(x, st)
    ref = linear_reference(x, st, None)
    # 128 + q carries the offset through the sum and removes it per group: a few fp32 ulps
    assert ((emu - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize("act_dtype", ["int8", "int4", "fp8"])
def test_emulation_with_codes_is_the_quantized_reference(act_dtype):
    torch.manual_seed(0)
    act = ActQuantSpec(act_dtype)
    st = random_store("int4", 64, 1024, 128, "cpu")
    x = torch.randn(5, 1024)
    codes, scales = quantize_act_reference(x, act)
    emu = w4a16_wgmma_small_emulate(codes.float(), st, scales)
    ref = linear_reference(x, st, act)
    assert ((emu - ref).norm() / ref.norm()).item() < 1e-5


def test_support_rules_and_configs():
    st = random_store("int4", 256, 1024, 128, "cpu")
    for m, bm in ((1, 8), (8, 8), (9, 16), (16, 16), (17, 32), (32, 32)):
        cfgs = small_configs(m)
        assert cfgs and {c.bm for c in cfgs} == {bm}
    assert small_configs(33) == []
    cfg = TileConfig(8, 64, 256, 2, 4, 4, maxnreg=64)  # 2 groups per stage, 8 groups over 2 slices
    assert small_supports(st, cfg, torch.bfloat16) and small_supports(st, cfg, torch.float16)
    assert not small_supports(st, cfg, torch.float32)
    assert not small_supports(st, TileConfig(8, 64, 256, 8, 4, 4), None)  # one group per slice: no whole stage
    assert not small_supports(st, TileConfig(8, 128, 128, 1, 4, 4), None)  # 16 rows per warp
    assert not small_supports(st, TileConfig(64, 64, 128, 1, 4, 4), None)  # not a few-token tile
    assert not small_supports(random_store("int4", 256, 1024, 64, "cpu"), cfg, None)  # group 64
    assert not small_supports(random_store("int4", 256, 1536, 128, "cpu"), cfg, None)  # 12 groups: TMA boxes of 8
    assert consumer_regs(TileConfig(8, 128, 128, 1, 8, 4)) == (168, 232, 40)
    assert consumer_regs(TileConfig(8, 128, 256, 1, 8, 3, maxnreg=80)) == (80, 96, 40)


def test_registered_for_every_int4_mode():
    from gearshift.dispatch.strategies import strategies_for

    assert "w4a16_wgmma_small" in [s.name for s in strategies_for("w4a16")]
    for mode in ("w4a8", "w4a4", "w4a8fp8"):
        assert "w4a8_wgmma_small" in [s.name for s in strategies_for(mode)]


_COMPILE = r"""
import torch
from triton.runtime.jit import mangle_type
from triton.experimental.gluon._runtime import GluonASTSource
from gearshift.dispatch.profiler import random_store
from gearshift.kernels import w4a16_wgmma_small as W
from gearshift.kernels import w4a16_wgmma as W16
from gearshift.kernels.config import TileConfig
from gearshift.kernels.w4a16_wgmma import _weight_descriptor
from gearshift.kernels.w4a8_wgmma import group_descriptors

def gluon_ptx(cfg, layout, f16=False, token_scales=False):
    st = random_store("int4", 4096, 4096, 128, "cpu", layout=layout)
    dt = torch.float16 if f16 else torch.bfloat16
    xd = W._act_descriptor(torch.empty(cfg.bm, 4096, dtype=dt), cfg.bm, 128)
    wd = _weight_descriptor(st, cfg.bn, 128)
    sd, md = group_descriptors(st, cfg.bn)
    sig = {"x_desc": mangle_type(xd), "w_desc": mangle_type(wd), "sc_desc": mangle_type(sd),
           "mn_desc": mangle_type(md), "xs_ptr": "*fp32", "y_ptr": "*fp16" if f16 else "*bf16", "ws_ptr": "*fp32",
           "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
    attrs = {(list(sig).index(n),): [["tt.divisibility", 16]] for n in ("y_ptr", "N", "K")}
    consumers = 2 if cfg.warps == 8 else 1
    cap, cregs, lregs = W.consumer_regs(cfg)
    cx = {"G": 128, "BN": cfg.bn, "STAGES": cfg.stages, "BLOCKS": layout == "blocks16", "F16": f16,
          "SPLIT_K": cfg.split_k, "CONSUMERS": consumers, "TOKEN_SCALES": token_scales, "GPS": cfg.bk // 128,
          "CREGS": cregs, "LREGS": lregs, "num_warps": cfg.warps // consumers, "ABLATE": 0,
          "VEC_STORE": W16.WGMMA_VEC_STORE}
    sig.update({name: "constexpr" for name in cx})
    names = list(sig)
    src = GluonASTSource(fn=W.w4a16_wgmma_small_kernel, signature=sig,
                         constexprs={(names.index(k),): v for k, v in cx.items()}, attrs=attrs)
    opts = {"num_warps": cfg.warps // consumers, **({"maxnreg": cap} if cap else {})}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]

out["bf16_m8_blocks16_gps2"] = gluon_ptx(TileConfig(8, 64, 256, 1, 4, 4, maxnreg=64), "blocks16")
out["f16_m16_rows_two_consumers_splitk"] = gluon_ptx(TileConfig(16, 128, 128, 2, 8, 4), "rows", True, True)
"""


@pytest.fixture(scope="module")
def gluon_ptx(compile_sm90):
    return compile_sm90(_COMPILE)


def test_compiles_to_wgmma_with_tokens_as_n(gluon_ptx):
    p = gluon_ptx["bf16_m8_blocks16_gps2"]
    assert "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16" in p
    assert "cp.async.bulk.tensor" in p and "setmaxnreg" in p
    # the widening: one multiply and one LOP3 per byte, no per-weight FMA (scale-after per group)
    assert p.count("mul.lo.u32") >= 64 and p.count("fma.rn.f32") < 32
    p = gluon_ptx["f16_m16_rows_two_consumers_splitk"]
    assert "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16" in p
    assert "atom.global.gpu.acq_rel.add" in p



@needs_hopper
@pytest.mark.parametrize("layout", [ROWS, BLOCKS16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_matches_its_model_and_the_reference(layout, dtype):
    from gearshift.kernels.w4a16_wgmma_small import w4a16_wgmma_small

    torch.manual_seed(0)
    st = random_store("int4", 384, 2048, 128, "cuda", layout=layout)
    for m in (1, 3, 8, 13, 16, 29):
        x = torch.randn(m, 2048, device="cuda", dtype=dtype)
        emu = w4a16_wgmma_small_emulate(x, st).float()
        ref = linear_reference(x.float(), st, None).float()
        for cfg in small_configs(m):
            if not small_supports(st, cfg, dtype):
                continue
            y = w4a16_wgmma_small(x, st, cfg).float()
            assert ((y - emu).norm() / emu.norm()).item() < 4e-3, (m, cfg)  # one rounding to 16 bits
            assert ((y - ref).norm() / ref.norm()).item() < 1e-2, (m, cfg)
            if cfg.split_k > 1:
                assert torch.equal(y, w4a16_wgmma_small(x, st, cfg).float())


@needs_hopper
@pytest.mark.parametrize("act_dtype", ["int8", "int4", "fp8"])
def test_w4a8_path_matches_the_quantized_reference(act_dtype):
    from gearshift.kernels.w4a16_wgmma_small import w4a8_wgmma_small

    torch.manual_seed(0)
    act = ActQuantSpec(act_dtype)
    st = random_store("int4", 256, 1024, 128, "cuda", layout=BLOCKS16)
    x = torch.randn(11, 1024, device="cuda", dtype=torch.bfloat16)
    ref = linear_reference(x.float(), st, act).float()
    bound = 3e-2 if act_dtype in ("int4", "fp8") else 1e-2  # the quantizers' rounding (docs/kernels.md bounds)
    for cfg in small_configs(11)[:4]:
        y = w4a8_wgmma_small(x, st, act, cfg).float()
        assert ((y - ref).norm() / ref.norm()).item() < bound, cfg
