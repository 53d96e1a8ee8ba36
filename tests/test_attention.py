"""`model.attention.cache_attention`: the model's attention over the KV cache on a chosen SDPA backend,
with grouped K/V heads repeated a few sequences at a time."""

import pytest
import torch

from gearshift.kernels.switches import set_switches, state
from gearshift.model.attention import cache_attention


def _inputs(b, h, kv, t, s, device="cpu", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, 16, generator=g).to(device, dtype)
    cache_k = torch.randn(b, kv, s + 7, 16, generator=g).to(device, dtype)  # a cache longer than the view
    cache_v = torch.randn(b, kv, s + 7, 16, generator=g).to(device, dtype)
    pos = torch.arange(t).view(1, t) + (s - t) - torch.arange(b).view(b, 1)  # rows of different lengths
    visible = torch.arange(s).view(1, 1, 1, s) <= pos.view(b, 1, t, 1)
    assert visible.any(-1).all(), "every query sees a key (a model's query always sees itself)"
    mask = torch.zeros(visible.shape).masked_fill_(~visible, float("-inf")).to(device, dtype)
    return q, cache_k[:, :, :s], cache_v[:, :, :s], mask


def _reference(q, k, v, mask):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).double(), v.repeat_interleave(rep, 1).double()
    w = torch.softmax(q.double() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + mask.double(), dim=-1)
    return (w @ v).to(q.dtype)


@pytest.mark.parametrize("heads", [(8, 2), (4, 4)])
@pytest.mark.parametrize("expand_bytes", [1, 1 << 30])  # one sequence per chunk, or all at once
def test_chunked_repeated_heads_are_torchs_grouped_attention(heads, expand_bytes):
    h, kv = heads
    q, k, v, mask = _inputs(5, h, kv, 6, 11)
    out = cache_attention(q, k, v, mask, backend="math", expand_bytes=expand_bytes)
    torch.testing.assert_close(out, _reference(q, k, v, mask), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, cache_attention(q, k, v, mask, backend="auto"), rtol=1e-5, atol=1e-5)


def test_a_mask_shared_by_all_rows():
    q, k, v, mask = _inputs(3, 4, 2, 5, 9)
    shared = mask[:1]
    out = cache_attention(q, k, v, shared, backend="math", expand_bytes=1)
    torch.testing.assert_close(out, _reference(q, k, v, shared.expand(3, -1, -1, -1)), rtol=1e-5, atol=1e-5)


def test_the_backend_switch_is_checked():
    before = dict(state())["sdpa_backend"]
    assert before == "efficient"
    with pytest.raises(ValueError, match="sdpa_backend must be one of"):
        set_switches(sdpa_backend="cudnn")
    assert dict(state())["sdpa_backend"] == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the efficient backend is CUDA's")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_efficient_backend_on_the_gpu(dtype):
    q, k, v, mask = _inputs(15, 32, 8, 37, 53, "cuda", dtype)
    ref = _reference(q.float(), k.float(), v.float(), mask.float())
    for backend in ("efficient", "auto"):
        torch.testing.assert_close(cache_attention(q, k, v, mask, backend=backend).float(), ref.float(),
                                   rtol=2e-2, atol=2e-2)
