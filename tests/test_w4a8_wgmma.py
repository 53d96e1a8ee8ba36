"""The int8-wgmma W4A8 / W4A4 Gluon kernel (`kernels/w4a8_wgmma.py`).

On CPU: its torch model against the reference, the support rules, and an sm_90 compile (which
also proves the byte tile's register layout is the int8 wgmma A fragment, and that the int32 ->
fp32 step has no I2F). On a Hopper GPU: the kernel against its torch model and the reference.
"""

from __future__ import annotations

import pytest
import torch

from gearshift.dispatch.profiler import random_store
from gearshift.kernels.act_quant import quantize_act_reference
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.w4a8_wgmma import (HAS_GLUON, int8_wgmma_configs, int8_wgmma_supports,
                                          w4a8_int8_wgmma_emulate)
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.int4 import BLOCKS16, ROWS

from hopper import needs_hopper  # tests/hopper.py

pytestmark = pytest.mark.skipif(not HAS_GLUON, reason="this Triton has no Gluon")


@pytest.mark.parametrize("act_dtype", ["int8", "int4"])
def test_emulation_is_the_reference(act_dtype):
    torch.manual_seed(0)
    act = ActQuantSpec(act_dtype)
    st = random_store("int4", 96, 1024, 128, "cpu")
    x = torch.randn(37, 1024)
    codes, scales = quantize_act_reference(x, act)
    emu = w4a8_int8_wgmma_emulate(codes, scales, st, torch.float32)
    ref = linear_reference(x, st, act)
    assert ((emu - ref).norm() / ref.norm()).item() < 1e-5  # the same products, fp32 sums in another order


def test_support_rules():
    st = random_store("int4", 256, 1024, 128, "cpu")
    cfgs = int8_wgmma_configs(256)
    assert cfgs and all(int8_wgmma_supports(st, ActQuantSpec("int8"), c) for c in cfgs)
    c = cfgs[0]
    assert int8_wgmma_supports(st, ActQuantSpec("int4"), c)
    assert not int8_wgmma_supports(st, ActQuantSpec("fp8"), c)  # e4m3 codes are not integers
    assert not int8_wgmma_supports(st, ActQuantSpec("int8", group_size=32), c)
    assert not int8_wgmma_supports(st, None, c)
    assert not int8_wgmma_supports(random_store("int4", 256, 1024, 64, "cpu"), ActQuantSpec("int8"), c)  # BK != G
    assert int8_wgmma_configs(16) == []
    from gearshift.kernels.w4a8_wgmma import int8_wgmma_codes

    codes, scales = torch.zeros(5, 1024, dtype=torch.int8), torch.ones(5)
    with pytest.raises(ValueError, match="sums_by_group=True"):  # [M, K / G] sums: the other layout
        int8_wgmma_codes(codes, scales, torch.zeros(5, 8), st, c, torch.bfloat16)
    # scales and mins travel by TMA in 8-group boxes: rows of K / G groups must be 16-byte aligned
    assert not int8_wgmma_supports(random_store("int4", 256, 1536, 128, "cpu"), ActQuantSpec("int8"), c)


_COMPILE = r"""
import torch
from triton.runtime.jit import mangle_type
from triton.experimental.gluon._runtime import GluonASTSource
from gearshift.dispatch.profiler import random_store
from gearshift.kernels import w4a8_wgmma as W
from gearshift.kernels import w4a16_wgmma as W16
from gearshift.kernels.w4a16_wgmma import _weight_descriptor

def gluon_ptx(bm, bn, warps, stages, layout, maxnreg=None, split_k=1, consumers=1):
    st = random_store("int4", 4096, 4096, 128, "cpu", layout=layout)
    xd = W._code_descriptor(torch.empty(bm, 4096, dtype=torch.int8), bm, 128)
    wd = _weight_descriptor(st, bn, 128, swizzle=64)
    sd, md = W.group_descriptors(st, bn)
    ud = W._sums_descriptor(torch.empty(32, bm, dtype=torch.float32), bm)
    sig = {"x_desc": mangle_type(xd), "w_desc": mangle_type(wd), "sc_desc": mangle_type(sd),
           "mn_desc": mangle_type(md), "sum_desc": mangle_type(ud), "xs_ptr": "*fp32", "y_ptr": "*bf16",
           "ws_ptr": "*fp32", "cnt_ptr": "*i32",
           "M": "i32", "N": "i32", "K": "i32"}
    attrs = {(list(sig).index(n),): [["tt.divisibility", 16]] for n in ("y_ptr", "N", "K")}
    cx = {"G": 128, "BN": bn, "STAGES": stages, "BLOCKS": layout == "blocks16", "SPLIT_K": split_k,
          "CONSUMERS": consumers, "num_warps": warps, "ABLATE": 0, "VEC_STORE": W16.WGMMA_VEC_STORE}
    sig.update({name: "constexpr" for name in cx})
    names = list(sig)
    src = GluonASTSource(fn=W.w4a8_int8_wgmma_kernel, signature=sig,
                         constexprs={(names.index(k),): v for k, v in cx.items()}, attrs=attrs)
    opts = {"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]

out["one_consumer_blocks16"] = gluon_ptx(128, 64, 4, 4, "blocks16", 168)
out["two_consumers_rows_splitk"] = gluon_ptx(128, 128, 4, 4, "rows", 168, 2, 2)
"""


@pytest.fixture(scope="module")
def gluon_ptx(compile_sm90):
    return compile_sm90(_COMPILE)


@pytest.mark.parametrize("name", ["one_consumer_blocks16", "two_consumers_rows_splitk"])
def test_compiles_to_int8_wgmma_without_i2f(gluon_ptx, name):
    p = gluon_ptx[name]
    assert "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8" in p
    assert "cp.async.bulk.tensor" in p and "setmaxnreg" in p
    assert "cvt.rn.f32.s32" not in p  # the magic-number conversion, not I2F
    if name == "two_consumers_rows_splitk":
        assert "atom.global.gpu.acq_rel.add" in p



@needs_hopper
@pytest.mark.parametrize("layout", [ROWS, BLOCKS16])
@pytest.mark.parametrize("act_dtype", ["int8", "int4"])
def test_kernel_matches_its_model_and_the_reference(layout, act_dtype):
    from gearshift.kernels.act_quant import quantize_act_triton
    from gearshift.kernels.w4a8_wgmma import int8_wgmma_codes, w4a8_int8_wgmma

    torch.manual_seed(0)
    act = ActQuantSpec(act_dtype)
    st = random_store("int4", 384, 1024, 128, "cuda", layout=layout)
    bound = 3e-2 if act_dtype == "int4" else 5e-3  # the quantizers' rounding (docs/kernels.md bounds)
    for m in (1, 64, 100, 300):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        codes, scales, sums = quantize_act_triton(x, act, group_sums=128, sums_by_group=True)
        emu = w4a8_int8_wgmma_emulate(codes, scales, st, torch.float32).cpu()
        ref = linear_reference(x.float(), st, act).cpu()
        for cfg in int8_wgmma_configs(max(m, 64)):
            if not int8_wgmma_supports(st, act, cfg):
                continue
            y = int8_wgmma_codes(codes, scales, sums, st, cfg, torch.float32).cpu()
            assert ((y - emu).norm() / emu.norm()).item() < 1e-5, (m, cfg)
            y2 = w4a8_int8_wgmma(x, st, act, cfg).float().cpu()
            assert ((y2 - ref).norm() / ref.norm()).item() < bound, (m, cfg)
            if cfg.split_k > 1:
                assert torch.equal(y, int8_wgmma_codes(codes, scales, sums, st, cfg, torch.float32).cpu())
