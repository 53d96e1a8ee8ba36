"""RoPE of q and k plus the KV-cache write in one launch vs the three-kernel path and the torch
reference (TRITON_INTERPRET=1 on CPU)."""

import os

import pytest
import torch

from gearshift.kernels._triton import HAS_TRITON

if not HAS_TRITON or (os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available()):
    pytest.skip("needs triton with TRITON_INTERPRET=1 or a GPU", allow_module_level=True)

from gearshift.kernels.kv_write import kv_write_triton  # noqa: E402
from gearshift.kernels.rope import rope_triton  # noqa: E402
from gearshift.kernels.rope_kv_write import (rope_kv_write_reference, rope_kv_write_triton,  # noqa: E402
                                             split_qkv)
from gearshift.model.kv_cache import KVCache  # noqa: E402
from gearshift.model.rope import Rotary  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
_HALF = torch.bfloat16 if DEV == "cuda" else torch.float16  # the interpreter truncates to bf16


def _case(b, t, hq, hkv, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, t, (hq + 2 * hkv) * d + 8, generator=g)[..., 8:].to(dtype).to(DEV)  # strided rows
    positions = torch.randint(0, 12 - t, (b, 1), generator=g).to(DEV) + torch.arange(t, device=DEV)
    cos, sin = Rotary(d, 10000.0, None).to(DEV)(positions, dtype)
    valid = torch.rand(b, t, generator=g).to(DEV) > 0.3  # some padding tokens go to the scratch slot
    valid[:, 0] = True
    return qkv, cos, sin, positions, valid


@pytest.mark.parametrize("b,t,hq,hkv,d", [(1, 1, 4, 2, 16), (3, 4, 4, 1, 32), (2, 5, 2, 2, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, _HALF])
def test_rope_kv_write_equals_the_three_kernel_path(b, t, hq, hkv, d, dtype):
    qkv, cos, sin, positions, valid = _case(b, t, hq, hkv, d, dtype, b * t + d)
    one, three, ref = (KVCache(2, b, hkv, d, 12, dtype, DEV) for _ in range(3))
    tgt = one.targets(positions, valid)
    real = slice(0, 12)  # position 12 is the scratch slot: several padding tokens may race there

    q1 = rope_kv_write_triton(qkv, hq, hkv, cos, sin, one.k[1], one.v[1], tgt)
    q, k, v = split_qkv(qkv, hq, hkv, d)
    q3 = rope_triton(q, cos, sin)
    kv_write_triton(three.k[1], three.v[1], rope_triton(k, cos, sin), v, tgt)
    assert q1.shape == (b, t, hq, d) and q1.is_contiguous()
    assert torch.equal(q1, q3)
    assert torch.equal(one.k[..., real, :], three.k[..., real, :])
    assert torch.equal(one.v[..., real, :], three.v[..., real, :])
    assert one.k[1][:, :, real].abs().sum() > 0 and one.k[0].abs().sum() == 0  # only layer 1 written

    qr = rope_kv_write_reference(qkv, hq, hkv, cos, sin, ref.k[1], ref.v[1], tgt)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(q1.float(), qr.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(one.k[..., real, :].float(), ref.k[..., real, :].float(), atol=tol, rtol=tol)
    assert torch.equal(one.v[..., real, :], ref.v[..., real, :])  # v is copied, not computed


def test_unsupported_layout_falls_back_to_the_reference():
    qkv, cos, sin, positions, valid = _case(1, 2, 2, 1, 12, torch.float32, 0)  # D/2 = 6: not a power of two
    a, b = KVCache(1, 1, 1, 12, 12, torch.float32, DEV), KVCache(1, 1, 1, 12, 12, torch.float32, DEV)
    tgt = a.targets(positions, valid)
    qa = rope_kv_write_triton(qkv, 2, 1, cos, sin, a.k[0], a.v[0], tgt)
    qb = rope_kv_write_reference(qkv, 2, 1, cos, sin, b.k[0], b.v[0], tgt)
    assert torch.equal(qa, qb) and torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
