"""Logits parity with Hugging Face transformers on tiny random checkpoints (contract 5)."""

import pytest
import torch

from gearshift.model.loader import load_model

transformers = pytest.importorskip("transformers")


def hf_logits(path, ids, dtype):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen2", "tiny-qwen3", "tiny-llama3"])
def test_fp32_logits_match_transformers(model_dir, preset):
    path = model_dir(preset)
    ids = torch.randint(0, 500, (2, 96), generator=torch.Generator().manual_seed(1))  # past llama3's 64-token base
    ref = hf_logits(path, ids, torch.float32)
    lm = load_model(path, progress=False)
    out = lm.model(ids, lm.model.new_cache(2, 128), [0, 0], [96, 96], mode="w16a16")
    assert torch.allclose(out, ref, atol=1e-4, rtol=1e-4), (out - ref).abs().max()


def test_bf16_logits_match_transformers(model_dir):
    path = model_dir("tiny")
    ids = torch.randint(0, 500, (1, 32), generator=torch.Generator().manual_seed(2))
    ref = hf_logits(path, ids, torch.bfloat16)
    lm = load_model(path, dtype=torch.bfloat16, progress=False)
    out = lm.model(ids, lm.model.new_cache(1, 64), [0], [32], mode="w16a16")
    rel = (out - ref).norm() / ref.norm()
    assert rel < 1e-2, rel


def test_incremental_decode_equals_full_forward(model_dir):
    lm = load_model(model_dir("tiny-qwen3"), progress=False)
    ids = torch.randint(0, 500, (1, 20))
    full = lm.model(ids, lm.model.new_cache(1, 32), [0], [20], mode="w16a16")
    cache = lm.model.new_cache(1, 32)
    lm.model(ids[:, :12], cache, [0], [12], mode="w16a16")
    steps = [lm.model(ids[:, i:i + 1], cache, [i], [1], mode="w16a16") for i in range(12, 20)]
    assert torch.allclose(torch.cat(steps, 1), full[:, 12:], atol=1e-5)


def test_padded_batch_equals_single(model_dir):
    lm = load_model(model_dir("tiny"), progress=False)
    a, b = torch.randint(0, 500, (1, 9)), torch.randint(0, 500, (1, 4))
    batch = torch.zeros(2, 9, dtype=torch.long)
    batch[0], batch[1, :4] = a[0], b[0]
    out = lm.model(batch, lm.model.new_cache(2, 16), [0, 0], [9, 4], mode="w16a16", logits="last")
    one = lm.model(b, lm.model.new_cache(1, 16), [0], [4], mode="w16a16", logits="last")
    assert torch.allclose(out[1], one[0], atol=1e-5)


def test_kv_overwrite_and_truncate(model_dir):
    """Rewriting positions with other tokens, then truncating, leaves the cache as if never written."""
    lm = load_model(model_dir("tiny"), progress=False)
    ids = torch.randint(0, 500, (1, 10))
    junk = torch.randint(0, 500, (1, 4))
    cache = lm.model.new_cache(1, 32)
    lm.model(ids[:, :6], cache, [0], [6], mode="w16a16")
    lm.model(junk, cache, [6], [4], mode="w16a16")  # draft-like entries at 6..9
    out = lm.model(ids[:, 6:10], cache, [6], [4], mode="w16a16")  # overwrite them
    ref = lm.model(ids, lm.model.new_cache(1, 32), [0], [10], mode="w16a16")[:, 6:]
    assert torch.allclose(out, ref, atol=1e-5)
    cache.truncate(0, 7)
    assert cache.lengths == [7]
    nxt = lm.model(ids[:, 7:8], cache, [7], [1], mode="w16a16")
    assert torch.allclose(nxt, ref[:, 1:2], atol=1e-5)


def test_int4_model_close_to_dense(model_dir):
    from gearshift.model.loader import quantize_linears

    lm = load_model(model_dir("tiny"), progress=False)
    ids = torch.randint(0, 500, (1, 16))
    dense = lm.model(ids, lm.model.new_cache(1, 32), [0], [16], mode="w16a16")
    quantize_linears(lm, "int4", 32, progress=False)
    q = lm.model(ids, lm.model.new_cache(1, 32), [0], [16], mode="w4a16")
    assert (q - dense).norm() / dense.norm() < 0.2
    with pytest.raises(Exception, match="needs 16-bit weights"):
        lm.model(ids, lm.model.new_cache(1, 32), [0], [16], mode="w16a16")


def test_sharded_checkpoint_loads_like_single(model_dir, tmp_path):
    from gearshift.model.tiny import write_random_model

    sharded = write_random_model(tmp_path / "sharded", "tiny", shard_bytes=200_000)
    assert (sharded / "model.safetensors.index.json").exists()
    ids = torch.randint(0, 500, (1, 8))
    a = load_model(sharded, progress=False).model
    b = load_model(model_dir("tiny"), progress=False).model
    assert torch.equal(a(ids, a.new_cache(1, 16), [0], [8], mode="w16a16"), b(ids, b.new_cache(1, 16), [0], [8], mode="w16a16"))
