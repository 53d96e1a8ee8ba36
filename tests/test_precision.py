"""GEARBX PrecisionManager: discovery, lossless high gear, exact low/mid gears, offload, gear cache."""

import warnings

import pytest
import torch

from gearshift.decode.precision import PrecisionManager, discover
from gearshift.model.loader import load_model
from gearshift.quant.detect import DoubleQuantizationWarning
from gearshift.quant.int4 import Int4Weight
from gearshift.quant.int8 import Int8Weight
from gearshift.quant.rowwise import quantize_rowwise

TOKENS = torch.tensor([[1, 5, 7, 9, 11, 13, 2, 40], [3, 4, 8, 100, 200, 17, 0, 0]])


def logits(model, mode="native"):
    cache = model.new_cache(2, 16)
    return model(TOKENS, cache, [0, 0], [8, 6], mode=mode, logits="all")


@pytest.fixture
def dense(model_dir):
    return load_model(model_dir("tiny"), progress=False).model


def test_discovery_attention_default_mlp_option(dense):
    names = [n for n, *_ in discover(dense)]
    assert names == ["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                     "model.layers.1.self_attn.qkv_proj", "model.layers.1.self_attn.o_proj"]
    mgr = PrecisionManager(dense)
    assert mgr.prefixes == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    mlp = [n for n, *_ in discover(dense, "mlp")]
    assert mlp == ["model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj",
                   "model.layers.1.mlp.gate_up_proj", "model.layers.1.mlp.down_proj"]
    both = [n for n, *_ in discover(dense, "attention+mlp")]
    assert len(both) == 8 and "lm_head" not in both
    with pytest.raises(ValueError):
        discover(dense, "everything")


def test_lazy_no_quantization_at_construction(dense):
    mgr = PrecisionManager(dense)
    assert mgr.quantize_calls == 0 and mgr.built_gears() == [] and mgr.gear == "high"


def test_high_gear_bit_identical_after_round_trip(dense):
    ref = logits(dense)
    ref_w16 = logits(dense, "w16a16")
    assert torch.equal(ref, ref_w16)
    mgr = PrecisionManager(dense, "attention+mlp")
    mgr.shift("low")
    assert not torch.equal(logits(dense), ref)
    mgr.shift("mid")
    mgr.shift("high")
    assert torch.equal(logits(dense), ref)


@pytest.mark.parametrize("gear,bits,cls", [("low", 4, Int4Weight), ("mid", 8, Int8Weight)])
def test_forced_gear_equals_manual_rowwise(model_dir, gear, bits, cls):
    a = load_model(model_dir("tiny"), progress=False).model
    b = load_model(model_dir("tiny"), progress=False).model
    mgr = PrecisionManager(a)
    mgr.shift(gear)
    for name, lin in b.linear_layers():
        if "self_attn" in name:
            lin.set_store(quantize_rowwise(lin.store.weight, bits))
    for (na, la), (nb, lb) in zip(a.linear_layers(), b.linear_layers()):
        assert na == nb
        assert type(la.store) is type(lb.store)
        if "self_attn" in na:
            assert isinstance(la.store, cls)
            if cls is Int4Weight:
                assert la.store.group_size == la.store.in_features  # per-row int4 (group = K)
    assert torch.equal(logits(a), logits(b))


def test_offload_originals_leave_the_tree_and_come_back(dense):
    mgr = PrecisionManager(dense)
    originals = {l.name: l.original for l in mgr.layers}
    tensors = {l.name: dict(l.original.named_buffers()) for l in mgr.layers}
    orig_bytes = sum(s.nbytes() for s in originals.values())
    assert mgr.device_bytes() == orig_bytes
    mgr.shift("low")
    tree_stores = {id(m) for m in dense.modules()}
    tree_ptrs = {t.data_ptr() for t in dense.buffers()}
    for name, st in originals.items():
        assert id(st) not in tree_stores
        assert all(t.data_ptr() not in tree_ptrs for t in st.buffers())
    low_bytes = sum(l.module.store.nbytes() for l in mgr.layers)
    assert mgr.device_bytes() == low_bytes < orig_bytes / 4 + 4 * 1024  # int4 + fp16 scales, fp32 originals
    assert mgr.host_bytes() == orig_bytes
    assert mgr.gear_device_bytes["low"] == low_bytes
    mgr.shift("high")
    for l in mgr.layers:
        assert l.module.store is originals[l.name]
        for k, t in l.module.store.named_buffers():
            assert t is tensors[l.name][k]  # the very same tensors
    # cached low gear now sits in the host pool, not on the "device"
    assert mgr.device_bytes() == orig_bytes and mgr.host_bytes() == low_bytes


def test_device_bytes_per_gear_measured(dense):
    mgr = PrecisionManager(dense)
    for g in ("low", "mid", "high"):
        mgr.shift(g)
        assert mgr.gear_device_bytes[g] == sum(l.module.store.nbytes() for l in mgr.layers)
    b = mgr.gear_device_bytes
    assert b["low"] < b["mid"] < b["high"]
    assert mgr.stats()["managed_device_bytes_by_gear"] == b


def test_gear_cache_no_requantization_and_faster(dense):
    calls = []

    def counting(w, bits):
        calls.append(bits)
        return quantize_rowwise(w, bits)

    mgr = PrecisionManager(dense, "attention+mlp", quantize_fn=counting)
    first = mgr.shift("low")
    assert first.kind == "quantize" and calls == [4] * 8
    mgr.shift("high")
    again = mgr.shift("low")
    assert again.kind == "cached" and calls == [4] * 8 and mgr.quantize_calls == 8
    assert again.seconds < first.seconds
    mgr.shift("mid")
    assert calls == [4] * 8 + [8] * 8
    mgr.shift("low")
    assert len(calls) == 16
    st = mgr.stats()
    assert st["shift_count"] == 5 and st["shift_cost_by_kind"]["cached"]["count"] == 2


def test_prewarm_builds_without_activating(dense):
    mgr = PrecisionManager(dense)
    ref = logits(dense)
    rec = mgr.prewarm("mid")
    assert rec.kind == "prewarm" and mgr.gear == "high" and mgr.built_gears() == ["mid"]
    assert torch.equal(logits(dense), ref)
    assert mgr.shift("mid").kind == "cached"
    assert mgr.prewarm("mid") is None and mgr.prewarm("high") is None


def test_double_quantization_warning_on_int4_source(model_dir):
    m = load_model(model_dir("tiny"), quantize="int4", group_size=32, progress=False).model
    mgr = PrecisionManager(m)
    with pytest.warns(DoubleQuantizationWarning):
        mgr.shift("low")
    assert len(mgr.prequantized) == len(mgr.layers)
    d = load_model(model_dir("tiny"), progress=False).model
    with warnings.catch_warnings():
        warnings.simplefilter("error", DoubleQuantizationWarning)
        PrecisionManager(d).shift("low")


def test_int4_source_high_gear_is_the_original_store(model_dir):
    m = load_model(model_dir("tiny"), quantize="int4", group_size=32, progress=False).model
    ref = logits(m, "w4a16")
    mgr = PrecisionManager(m)
    assert isinstance(mgr.layers[0].original, Int4Weight) and mgr.layers[0].original.group_size == 32
    with pytest.warns(DoubleQuantizationWarning):
        mgr.shift("low")
    assert mgr.layers[0].module.store.group_size == mgr.layers[0].module.store.in_features
    mgr.shift("high")
    assert torch.equal(logits(m), ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_offload_frees_cuda_memory(model_dir):
    m = load_model(model_dir("tiny", hidden_size=512, intermediate_size=1024), device="cuda",
                   dtype=torch.bfloat16, progress=False).model
    mgr = PrecisionManager(m)
    orig = sum(l.original.nbytes() for l in mgr.layers)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    mgr.shift("low")
    low = sum(l.module.store.nbytes() for l in mgr.layers)
    after = torch.cuda.memory_allocated()
    # the originals left the device (pinned host twins); the int4 gear arrived
    assert before - after >= orig - low - 64 * 1024
    assert all(t.device.type == "cpu" and t.is_pinned() for l in mgr.layers for t in l.original.buffers())
    assert mgr.device_bytes() == low
    mgr.shift("high")
    assert torch.cuda.memory_allocated() - after >= orig - low - 64 * 1024
    assert all(t.is_cuda for l in mgr.layers for t in l.module.store.buffers())
