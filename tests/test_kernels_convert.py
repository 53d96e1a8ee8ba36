"""The tensor-core GEMMs turn int4 codes (and int32 partials) into floats without I2F.

I2F / cvt from integers runs at 16 per clock per SM on Hopper, as slow as the MMA it feeds at
BM = 128. The kernels are compiled for sm_90 on this machine (Triton ships ptxas; a fresh process,
since the suite runs the interpreter) and their PTX is searched for integer-to-float `cvt`s.
Numerics are covered by tests/test_kernels.py.
"""

from __future__ import annotations

import re

import pytest

_COMPILE = r"""
from gearshift.kernels import w4a16, w4a8

ints = dict(M="i32", N="i32", K="i32", stride_xm="i32", stride_ym="i32")
for dt in ("bf16", "fp16"):
    sig = dict(x_ptr=f"*{dt}", qw_ptr="*u8", s_ptr="*fp16", mn_ptr="*fp16", y_ptr=f"*{dt}", ws_ptr="*fp32",
               cnt_ptr="*i32", **ints)
    for sa in (False, True):
        out[f"w4a16_{dt}_{'scale_after' if sa else 'dequant'}"] = ptx(w4a16._w4a16_kernel, sig, dict(
            G=128, BM=128, BN=128, BK=128, SPLIT_K=1, SCALE_AFTER=sa, JOIN=True, ASM=True, BLOCKS=False), 8, 3)
    for blocks in (False, True):  # the blocks16 layout must keep 16-byte weight loads
        out[f"w4a16_{dt}_small_{'blocks16' if blocks else 'rows'}"] = ptx(w4a16._w4a16_kernel, sig, dict(
            G=128, BM=16, BN=64, BK=128, SPLIT_K=1, SCALE_AFTER=True, JOIN=True, ASM=True, BLOCKS=blocks), 4, 3, ("N", "K", "stride_xm", "stride_ym"))
sig = dict(xq_ptr="*i8", xs_ptr="*fp32", xsum_ptr="*fp32", qw_ptr="*u8", s_ptr="*fp16", mn_ptr="*fp16", y_ptr="*bf16", ws_ptr="*fp32",
           cnt_ptr="*i32", **ints)
for fp8 in (False, True):
    out[f"w4a8_{'fp8' if fp8 else 'int8'}"] = ptx(w4a8._w4a8_kernel, sig, dict(
        G=128, BM=128, BN=128, BK=128, SPLIT_K=1, FP8=fp8, W_PARTS=1, WB=4, A_PARTS=1, JOIN=True, ASM=True,
        BLOCKS=False), 8, 3)
"""

INT_TO_FLOAT = re.compile(r"cvt\.\w+\.(?:f32|bf16|f16)\.[su](?:8|16|32)\b")


@pytest.fixture(scope="module")
def ptx(compile_sm90):
    return compile_sm90(_COMPILE)


@pytest.mark.parametrize("name", ["w4a16_bf16_dequant", "w4a16_bf16_scale_after", "w4a16_fp16_dequant",
                                  "w4a16_fp16_scale_after", "w4a8_fp8"])
def test_no_integer_to_float_conversion(ptx, name):
    assert INT_TO_FLOAT.findall(ptx[name]) == []


def test_int8_partials_use_the_magic_add(ptx):
    """The int32 MMA partials become fp32 through the 1.5 * 2^23 add, and the per-token code sums
    come from the activation quantizer: no integer-to-float conversion is left in the loop."""
    p = ptx["w4a8_int8"]
    assert INT_TO_FLOAT.findall(p) == []
    assert "1262485504" in p or "0x4B400000" in p.upper()  # 1.5 * 2^23 as bits


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_dequant_first_runs_the_packed_ptx(ptx, dt):
    """The dequant-first W4A16 loop builds 128 + q in fp32 bits and packs pairs with one cvt
    (`int4_unpack.dequant_tile`), not Triton's per-byte lowering."""
    p = ptx[f"w4a16_{dt}_dequant"]
    assert "lop3.b32" in p and "0x43000000" in p  # 128.0 as fp32 bits, in the inline PTX
    assert ("cvt.rn.bf16x2.f32" if dt == "bf16" else "cvt.rn.f16x2.f32") in p


@pytest.mark.parametrize("name", ["w4a8_int8", "w4a8_fp8"])
def test_w4a8_codes_run_the_packed_ptx(ptx, name):
    """Code bytes for the int8 / fp8 MMAs come from `int4_unpack.code_bytes` (SHR, PRMT, AND per
    four codes)."""
    assert "0x7250" in ptx[name]  # the PRMT selector of the inline PTX


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_blocks16_weights_load_as_wide_as_rows(ptx, dt):
    """The blocks16 address (int4_tile_pointers, w_tile_offset) keeps the weight copies 16 bytes
    wide: no byte loads, no more load instructions and no fewer 16-byte copies than the row layout
    (an address whose alignment Triton 3.6 could not see fell back to byte loads, 4-5x slower)."""
    def loads(name):
        p = ptx[name]
        return sorted(re.findall(r"ld\.global(?:\.[\w:]+)*\.(v4\.b32|v2\.b32|b32|b16|b8|u8)", p)
                      + re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*?, (0x\w+|\d+)(?:, \S+)?;", p))

    rows, blocks = loads(f"w4a16_{dt}_small_rows"), loads(f"w4a16_{dt}_small_blocks16")
    assert not {"b8", "u8"} & set(blocks) and len(blocks) <= len(rows), (rows, blocks)
    assert sum(w in ("0x10", "16", "v4.b32") for w in blocks) >= sum(w in ("0x10", "16", "v4.b32") for w in rows)
