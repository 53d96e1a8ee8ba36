"""The one-kernel RoPE vs its torch reference (TRITON_INTERPRET=1 on CPU, or the GPU)."""

import os

import pytest
import torch

from gearshift.kernels._triton import HAS_TRITON

if not HAS_TRITON or (os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available()):
    pytest.skip("needs triton with TRITON_INTERPRET=1 or a GPU", allow_module_level=True)

from gearshift.kernels.rope import rope_reference, rope_triton  # noqa: E402
from gearshift.model.rope import Rotary  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_matches_reference_on_a_strided_view(dtype):
    b, t, h, d = 2, 5, 3, 32
    g = torch.Generator().manual_seed(0)
    fused = torch.randn(b, t, (h + 2) * d, generator=g).to(DEV, dtype)  # like the fused qkv output
    x = fused[..., : h * d].view(b, t, h, d)
    pos = torch.arange(t).repeat(b, 1).to(DEV) + torch.tensor([[0], [7]], device=DEV)
    cos, sin = Rotary(d, 10000.0, None).to(DEV)(pos, dtype)
    y = rope_triton(x, cos, sin)
    ref = rope_reference(x.float(), cos.float(), sin.float())
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert y.is_contiguous() and torch.allclose(y.float(), ref, rtol=tol, atol=tol)
