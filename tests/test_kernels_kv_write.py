"""The one-launch KV-cache write vs its torch reference (TRITON_INTERPRET=1 on CPU)."""

import os

import pytest
import torch

from gearshift.kernels._triton import HAS_TRITON

if not HAS_TRITON or (os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available()):
    pytest.skip("needs triton with TRITON_INTERPRET=1 or a GPU", allow_module_level=True)

from gearshift.kernels.kv_write import kv_write_reference, kv_write_triton  # noqa: E402
from gearshift.model.kv_cache import KVCache  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("b,t,h,d", [(1, 1, 2, 16), (3, 4, 2, 32), (2, 5, 1, 64)])
def test_kv_write_matches_reference(b, t, h, d):
    g = torch.Generator().manual_seed(b * t + d)
    cache = KVCache(2, b, h, d, 12, torch.float32, DEV)
    ref = KVCache(2, b, h, d, 12, torch.float32, DEV)
    qkv = torch.randn(b, t, 3 * h * d, generator=g).to(DEV)  # k, v as strided views of a fused output
    k = qkv[..., h * d:2 * h * d].view(b, t, h, d)
    v = qkv[..., 2 * h * d:].view(b, t, h, d)
    positions = torch.randint(0, 12 - t, (b, 1), generator=g).to(DEV) + torch.arange(t, device=DEV)
    valid = torch.rand(b, t, generator=g).to(DEV) > 0.3  # some padding tokens go to the scratch slot
    valid[:, 0] = True
    tgt = cache.targets(positions, valid)
    real = slice(0, 12)  # position 12 is the scratch slot: several padding tokens may race there
    kv_write_triton(cache.k[1], cache.v[1], k, v, tgt)
    kv_write_reference(ref.k[1], ref.v[1], k, v, tgt)
    assert torch.equal(cache.k[:, :, :, real], ref.k[:, :, :, real])
    assert torch.equal(cache.v[:, :, :, real], ref.v[:, :, :, real])
    assert cache.k[1][:, :, real].abs().sum() > 0 and cache.k[0].abs().sum() == 0  # only layer 1 written
    # overwrite in place (QSPEC's verify pass rewrites draft entries): same positions, new values
    kv_write_triton(cache.k[1], cache.v[1], v, k, tgt)
    kv_write_reference(ref.k[1], ref.v[1], v, k, tgt)
    assert torch.equal(cache.k[:, :, :, real], ref.k[:, :, :, real])
    assert torch.equal(cache.v[:, :, :, real], ref.v[:, :, :, real])
