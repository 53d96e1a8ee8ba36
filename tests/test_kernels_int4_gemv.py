"""The magic-number int4 unpack and the single-token W4A16 GEMV vs their torch references
(TRITON_INTERPRET=1 on CPU), including the one-launch split-K reduction."""

import os

import pytest
import torch

from gearshift.kernels._triton import HAS_TRITON
from gearshift.kernels.config import TileConfig
from gearshift.quant.int4 import quantize_int4

if not HAS_TRITON or (os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available()):
    pytest.skip("needs triton with TRITON_INTERPRET=1 or a GPU", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gearshift.kernels.int4_gemv import int4_gemv, int4_gemv_reference, int4_gemv_supports  # noqa: E402
from gearshift.kernels.int4_unpack import ONE_BITS, nibble_f32, nibble_reference, word_bases  # noqa: E402
from gearshift.kernels.splitk import counters  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _unpack_kernel(w_ptr, out_ptr, one_bits, NW: tl.constexpr):
    offs = tl.arange(0, NW)
    w = tl.load(w_ptr + offs)
    lo, hi = word_bases(w, one_bits)
    for i in tl.static_range(8):
        tl.store(out_ptr + i * NW + offs, nibble_f32(lo, hi, i))


def test_nibbles_are_exact_for_every_code():
    """All 16 codes at all 8 positions, including words whose top bit is set (negative int32)."""
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (64, 8), generator=g)
    codes[:16, :] = torch.arange(16)[:, None]  # every code at every position
    words = torch.zeros(64, dtype=torch.int64)
    for i in range(8):
        words |= codes[:, i] << (4 * i)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # two's complement wrap
    out = torch.empty(8, 64, dtype=torch.float32, device=DEV)
    _unpack_kernel[(1,)](words.to(DEV), out, ONE_BITS, NW=64)
    for i in range(8):
        assert torch.equal(out[i].cpu(), nibble_reference(words, i)), i
        assert torch.equal(out[i].cpu(), codes[:, i].float()), i


@pytest.mark.parametrize("n,k,group,bn,bk,split", [(48, 256, 32, 16, 32, 1), (40, 512, 128, 16, 128, 2),
                                                    (32, 256, 256, 8, 128, 2), (64, 1024, 128, 32, 64, 4),
                                                    (24, 512, 512, 16, 128, 4)])
def test_gemv_matches_reference(n, k, group, bn, bk, split):
    g = torch.Generator().manual_seed(n + k)
    store = quantize_int4(torch.randn(n, k, generator=g), group, symmetric=group == 256).to(DEV)
    x = torch.randn(1, k, generator=g).to(DEV, torch.float16 if DEV == "cuda" else torch.float32)
    cfg = TileConfig(1, bn, bk, split, 2, 2)
    assert int4_gemv_supports(store, cfg)
    y = int4_gemv(x, store, cfg)
    ref = int4_gemv_reference(x.float(), store)
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if DEV == "cuda" else 1e-5), rel
    if split > 1:  # the last program resets its counter: nothing is left for the next launch
        assert int(counters(x.device, 1)[: triton.cdiv(n, bn)].abs().sum()) == 0
        assert torch.equal(int4_gemv(x, store, cfg), y)  # fixed reduction order: bit-reproducible


def test_gemv_refuses_bad_tiling():
    store = quantize_int4(torch.randn(8, 256), 32)
    assert not int4_gemv_supports(store, TileConfig(1, 8, 64, 1))  # tile straddles a group
    with pytest.raises(ValueError):
        int4_gemv(torch.randn(1, 256), store, TileConfig(1, 8, 64, 1))
    with pytest.raises(ValueError):
        int4_gemv(torch.randn(2, 256), store, TileConfig(1, 8, 32, 1))
