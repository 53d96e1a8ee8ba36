"""The single-token W4A16 GEMV vs its torch reference (TRITON_INTERPRET=1 on CPU)."""

import os

import pytest
import torch

from gearshift.kernels._triton import HAS_TRITON
from gearshift.quant.int4 import quantize_int4

if not HAS_TRITON or (os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available()):
    pytest.skip("needs triton with TRITON_INTERPRET=1 or a GPU", allow_module_level=True)

from gearshift.kernels.w4a16_rowgemv import w4a16_rowgemv, w4a16_rowgemv_reference, w4a16_smallm  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n,k,group,bn,bk", [(48, 256, 32, 16, 128), (40, 512, 128, 16, 256), (32, 256, 256, 8, 128),
                                              (64, 512, 64, 32, 512)])
def test_rowgemv_matches_reference(n, k, group, bn, bk):
    g = torch.Generator().manual_seed(n + k)
    store = quantize_int4(torch.randn(n, k, generator=g), group, symmetric=group == 256).to(DEV)
    x = torch.randn(1, k, generator=g).to(DEV, torch.float16 if DEV == "cuda" else torch.float32)
    y = w4a16_rowgemv(x, store, bn=bn, bk=bk, warps=2, stages=2)
    ref = w4a16_rowgemv_reference(x.float(), store)
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if DEV == "cuda" else 1e-5), rel


def test_rowgemv_refuses_bad_tiling():
    store = quantize_int4(torch.randn(8, 96), 32)
    with pytest.raises(ValueError):
        w4a16_rowgemv(torch.randn(1, 96), store, bk=64)


@pytest.mark.parametrize("m,n,k,group,bn,bk", [(2, 48, 256, 32, 16, 128), (5, 40, 512, 128, 16, 256), (16, 32, 256, 256, 32, 128)])
def test_smallm_matches_reference(m, n, k, group, bn, bk):
    g = torch.Generator().manual_seed(m * n + k)
    store = quantize_int4(torch.randn(n, k, generator=g), group).to(DEV)
    x = torch.randn(m, k, generator=g).to(DEV, torch.float16)
    y = w4a16_smallm(x, store, bn=bn, bk=bk, warps=2, stages=2)
    ref = w4a16_rowgemv_reference(x.float(), store)
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    assert rel < 2e-3, rel
