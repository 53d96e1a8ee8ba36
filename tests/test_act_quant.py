"""Calibrated activation quantizers: Atom outliers, group scales, QuaRot Hadamard, checkpoints."""

import json

import pytest
import torch

from gearshift.engine.calibrate import (ActQuantOptions, calibrate_activations, clear_act_quantizers,
                                        collect_activation_stats, install_act_quantizers)
from gearshift.errors import GearshiftError
from gearshift.quant.act_quantizers import (HadamardActQuantizer, OutlierActQuantizer, fake_quantize_groups,
                                            hadamard_block_size, hadamard_matrix, rotation_matrix)
from gearshift.quant.activations import ACT_QUANTIZERS, ActQuantSpec, fake_quantize


def _tiny_int4(model_dir):
    from gearshift.model.loader import load_model, quantize_linears

    loaded = load_model(model_dir("tiny"), progress=False)
    quantize_linears(loaded, "int4", 32, progress=False)
    return loaded


def _tok_prompts(n=3, length=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 500, (length,), generator=g).tolist() for _ in range(n)]


# ------------------------------------------------------------------------- quantizer semantics

def test_registered():
    assert ACT_QUANTIZERS["outlier"] is OutlierActQuantizer
    assert ACT_QUANTIZERS["hadamard"] is HadamardActQuantizer


def test_outliers_kept_at_8_bits_exactly_where_chosen():
    k = 128
    x = torch.randn(5, 7, k)
    idx = [3, 40, 41, 100]
    x[..., idx] *= 50.0
    q = OutlierActQuantizer(k, idx, bits=4, group_size=None, outlier_bits=8)
    y = q.fake_quantize(x)
    normal = torch.ones(k, dtype=torch.bool)
    normal[idx] = False
    # outlier channels: one 8-bit scale per token over the outlier set
    ref_out = fake_quantize_groups(x[..., idx], 8, None)
    assert torch.equal(y[..., idx], ref_out)
    # the rest: 4-bit per token over the normal channels only (outliers do not inflate the scale)
    ref_norm = fake_quantize_groups(x[..., normal], 4, None)
    assert torch.equal(y[..., normal], ref_norm)
    # the outliers themselves are at 8-bit precision: error <= half an 8-bit step
    step = x[..., idx].abs().amax(-1, keepdim=True) / 127
    assert ((y[..., idx] - x[..., idx]).abs() <= step / 2 + 1e-5).all()
    # a 4-bit code grid on the normal channels: at most 15 distinct values per token
    assert max(len(torch.unique(row)) for row in y[..., normal].reshape(-1, k - 4)) <= 15
    assert q.perm[-4:].tolist() == idx and sorted(q.perm.tolist()) == list(range(k))


def test_outliers_reduce_error():
    k = 256
    x = torch.randn(64, k)
    x[:, [7, 77, 177]] *= 40
    err_plain = (fake_quantize(x, ActQuantSpec("int4")) - x).norm()
    q = OutlierActQuantizer(k, [7, 77, 177])
    assert (q.fake_quantize(x) - x).norm() < 0.3 * err_plain


def test_group_scales_over_normal_channels():
    k, g = 128, 32
    x = torch.randn(3, k)
    idx = list(range(96, 128))  # the last group are the outliers: groups of the rest stay aligned
    q = OutlierActQuantizer(k, idx, bits=4, group_size=g)
    y = q.fake_quantize(x)
    assert torch.equal(y[:, :96], fake_quantize(x[:, :96], ActQuantSpec("int4", g)))
    assert torch.equal(y[:, 96:], fake_quantize_groups(x[:, 96:], 8, 32))
    # no outliers: identical to the plain group-wise spec
    q0 = OutlierActQuantizer(k, None, bits=4, group_size=g)
    assert torch.equal(q0.fake_quantize(x), fake_quantize(x, ActQuantSpec("int4", g)))
    # group formed over the permuted normal channels, e.g. outliers at 0..31 shift nothing else
    q1 = OutlierActQuantizer(k, list(range(32)), bits=4, group_size=g)
    assert torch.equal(q1.fake_quantize(x)[:, 32:], fake_quantize(x[:, 32:], ActQuantSpec("int4", g)))


def test_outlier_count_must_fit_groups():
    with pytest.raises(ValueError):
        OutlierActQuantizer(128, [1, 2, 3], group_size=32)


def test_clip():
    x = torch.randn(4, 64)
    y = OutlierActQuantizer(64, None, bits=4, clip=0.5).fake_quantize(x)
    assert (y.abs().amax(-1) <= 0.5 * x.abs().amax(-1) + 1e-6).all()


@pytest.mark.parametrize("n", [1, 2, 4, 12, 20, 24, 48, 64, 72, 96, 576, 1536])
def test_hadamard_matrices(n):
    h = hadamard_matrix(n)
    assert h is not None and set(h.unique().tolist()) <= {-1.0, 1.0}
    assert torch.equal(h @ h.T, n * torch.eye(n, dtype=h.dtype))


def test_hadamard_block_choice():
    assert hadamard_block_size(576) == 576 and hadamard_block_size(1536) == 1536
    assert hadamard_block_size(128) == 128
    assert hadamard_block_size(36) in (12, 4)  # 36: no construction here, the largest block dividing it
    with pytest.raises(ValueError):
        hadamard_block_size(96, 36)


@pytest.mark.parametrize("k,block", [(128, None), (192, None), (192, 64)])
def test_rotation_orthogonal_and_a16_invariant(k, block):
    torch.manual_seed(0)
    q = HadamardActQuantizer(k, bits=4, block=block, seed=1)
    r = q.rotation.double()
    assert torch.allclose(r @ r.T, torch.eye(k, dtype=torch.float64), atol=1e-6)
    x, w = torch.randn(6, k), torch.randn(10, k)
    assert torch.allclose(q.unrotate(q.rotate(x)), x, atol=1e-5)
    # computational invariance: (x R)(W R)^T = x W^T, so the online rotation keeps W shared
    assert torch.allclose(q.rotate(x) @ q.rotate(w).T, x @ w.T, atol=1e-4)
    # a rotation with 8-bit quantization is close to the identity; 4-bit spreads outliers
    x[:, 5] *= 100
    err_rot = (q.fake_quantize(x) - x).norm()
    err_plain = (fake_quantize(x, ActQuantSpec("int4")) - x).norm()
    assert err_rot < (0.7 if block is None else 0.9) * err_plain
    q8 = HadamardActQuantizer(k, bits=8, seed=1)
    assert (q8.fake_quantize(x) - x).norm() / x.norm() < 0.02


def test_rotation_signs_matter():
    a = rotation_matrix(64, 64, torch.ones(64))
    b = HadamardActQuantizer(64, seed=3).rotation
    assert not torch.equal(a, b)


def test_state_round_trip():
    x = torch.randn(3, 128)
    q = OutlierActQuantizer(128, [5, 9, 60, 61], bits=4, group_size=None, clip=0.9)
    meta, t = q.to_state()
    json.dumps(meta)
    q2 = OutlierActQuantizer.from_state(meta, t)
    assert torch.equal(q.fake_quantize(x), q2.fake_quantize(x))
    h = HadamardActQuantizer(128, bits=4, group_size=32, seed=5)
    meta, t = h.to_state()
    json.dumps(meta)
    assert torch.equal(h.fake_quantize(x), HadamardActQuantizer.from_state(meta, t).fake_quantize(x))


# ------------------------------------------------------------------------- options

@pytest.mark.parametrize("text", ["tok", "g32", "o32", "g32+o32", "had", "had+g32", "g32+o64+clip0.9", "a8+g64",
                                  "o32max", "o16b4", "had64",
                                  "g32+o64,down:had+g32", "g32+o32,down:a8,o:g16"])
def test_options_parse_describe(text):
    o = ActQuantOptions.parse(text)
    assert ActQuantOptions.parse(o.describe()) == o


def test_options_errors():
    for bad in ["x3", "g", "had+o32", "clip2", "g32,down", "g32,mlp:a8"]:
        with pytest.raises(GearshiftError):
            ActQuantOptions.parse(bad)


# ------------------------------------------------------------------------- on a model

def test_calibration_installs_and_keeps_int4_store_bit_identical(model_dir):
    loaded = _tiny_int4(model_dir)
    before = {n: {b: t.clone() for b, t in lin.store.named_buffers()} for n, lin in loaded.model.linear_layers()}
    tok = torch.tensor([_tok_prompts(1)[0]])
    cache = loaded.model.new_cache(1, 64)
    ref16 = loaded.model(tok, cache, [0], [tok.shape[1]], mode="w4a16")
    opts = ActQuantOptions(group_size=32, outliers=32)
    meta = calibrate_activations(loaded, _tok_prompts(), opts, "w4a4", progress=False, new_tokens=4)
    assert meta["spec"] == "g32+o32" and meta["linears"] == 8 and meta["calibration_tokens"] > 0
    for n, lin in loaded.model.linear_layers():
        for b, t in lin.store.named_buffers():
            assert torch.equal(t, before[n][b]), f"{n}.{b} changed"
        if n != "lm_head":
            q = lin.act_overrides["w4a4"]
            assert isinstance(q, OutlierActQuantizer) and q.n_outliers == 32 and q.group_size == 32
    cache = loaded.model.new_cache(1, 64)
    assert torch.equal(loaded.model(tok, cache, [0], [tok.shape[1]], mode="w4a16"), ref16)  # W4A16 untouched
    cache = loaded.model.new_cache(1, 64)
    a4 = loaded.model(tok, cache, [0], [tok.shape[1]], mode="w4a4")
    assert not torch.equal(a4, ref16)
    assert loaded.info["quantization"]["activations"]["w4a4"]["outliers"] == 32


def test_outliers_are_the_largest_channels(model_dir):
    loaded = _tiny_int4(model_dir)
    stats = collect_activation_stats(loaded, _tok_prompts(2), new_tokens=2, progress=False)
    name = "model.layers.0.mlp.down_proj"
    s = stats[name]
    install_act_quantizers(loaded, ActQuantOptions(outliers=8), "w4a4", stats)
    q = dict(loaded.model.linear_layers())[name].act_overrides["w4a4"]
    ms = s["sumsq"] / s["count"]
    assert set(q.outlier_idx.tolist()) == set(torch.topk(ms, 8).indices.tolist())


def test_plain_group_option_installs_spec(model_dir):
    loaded = _tiny_int4(model_dir)
    install_act_quantizers(loaded, ActQuantOptions.parse("g32"), "w4a4")
    lin = dict(loaded.model.linear_layers())["model.layers.0.self_attn.o_proj"]
    assert lin.act_overrides["w4a4"] == ActQuantSpec("int4", 32)
    install_act_quantizers(loaded, ActQuantOptions.parse("had+g32"), "w4a8")
    assert isinstance(lin.act_overrides["w4a8"], HadamardActQuantizer) and lin.act_overrides["w4a8"].bits == 8
    clear_act_quantizers(loaded, "w4a8")
    assert "w4a8" not in lin.act_overrides and not hasattr(lin, "act_w4a8")


def test_outliers_need_stats(model_dir):
    loaded = _tiny_int4(model_dir)
    with pytest.raises(GearshiftError):
        install_act_quantizers(loaded, ActQuantOptions(outliers=32), "w4a4")
    with pytest.raises(GearshiftError):
        install_act_quantizers(loaded, ActQuantOptions(group_size=32), "w4a16")


def test_per_layer_type_options(model_dir):
    loaded = _tiny_int4(model_dir)
    opts = ActQuantOptions.parse("g32+o32,down:had+g32,o:a8")
    meta = calibrate_activations(loaded, _tok_prompts(2), opts, "w4a4", progress=False, new_tokens=2)
    assert meta["layers"]["down"]["hadamard"] is True and meta["spec"] == "g32+o32,down:had+g32,o:a8"
    lins = dict(loaded.model.linear_layers())
    assert isinstance(lins["model.layers.0.mlp.down_proj"].act_overrides["w4a4"], HadamardActQuantizer)
    assert lins["model.layers.0.self_attn.o_proj"].act_overrides["w4a4"] == ActQuantSpec("int8", None)
    for n in ("model.layers.1.self_attn.qkv_proj", "model.layers.1.mlp.gate_up_proj"):
        assert lins[n].act_overrides["w4a4"].n_outliers == 32


@pytest.mark.parametrize("spec", ["g32+o32", "had+g32", "g32", "o32+clip0.9", "g32+o32,down:had+g32"])
def test_checkpoint_round_trip(model_dir, tmp_path, spec):
    from gearshift.model.checkpoint import save_checkpoint
    from gearshift.model.loader import load_model

    loaded = _tiny_int4(model_dir)
    opts = ActQuantOptions.parse(spec)
    calibrate_activations(loaded, _tok_prompts(2), opts, "w4a4", progress=False, new_tokens=2)
    calibrate_activations(loaded, _tok_prompts(2), opts, "w4a8", progress=False, new_tokens=2)
    out = save_checkpoint(loaded, tmp_path / "ckpt")
    manifest = json.loads((out / "gearshift.json").read_text())
    assert manifest["quantization"]["activations"]["w4a4"]["spec"] == opts.describe()
    assert manifest["quantization"]["activations"]["w4a8"]["act_bits"] == 8
    back = load_model(out, progress=False)
    tok = torch.tensor([_tok_prompts(1, seed=9)[0]])
    for mode in ("w4a16", "w4a4", "w4a8"):
        y = [m.model(tok, m.model.new_cache(1, 32), [0], [tok.shape[1]], mode=mode) for m in (loaded, back)]
        assert torch.equal(y[0], y[1]), mode
    a = dict(back.model.linear_layers())["model.layers.1.mlp.down_proj"].act_overrides["w4a4"]
    b = dict(loaded.model.linear_layers())["model.layers.1.mlp.down_proj"].act_overrides["w4a4"]
    assert type(a) is type(b)
    if isinstance(a, OutlierActQuantizer):
        assert torch.equal(a.outlier_idx, b.outlier_idx) and torch.equal(a.perm, b.perm)


def test_cli_act_options(model_dir, tmp_path):
    import argparse

    from gearshift.cli.act_options import add_act_quant_args, apply_act_quant

    p = argparse.ArgumentParser()
    add_act_quant_args(p)
    prompts = tmp_path / "calib.txt"
    prompts.write_text("hello world\nthe quick brown fox\n")
    loaded = _tiny_int4(model_dir)
    args = p.parse_args(["--act-group-size", "32", "--act-outliers", "32", "--act-modes", "w4a4,w4a8",
                         "--calibration-prompts", str(prompts), "--calibration-tokens", "2"])
    out = apply_act_quant(args, loaded, progress=False)
    assert set(out) == {"w4a4", "w4a8"} and out["w4a4"]["calibration_prompts"] == 2
    assert apply_act_quant(p.parse_args([]), loaded) == {}
    with pytest.raises(GearshiftError):
        apply_act_quant(p.parse_args(["--act-quant", "g32", "--act-modes", "w4a16"]), loaded)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_wide_quantizer_programs_give_the_same_codes(monkeypatch):
    """act_quant.WIDE_ROWS (twice the warps per program for few rows) changes only the launch: the
    same codes and scales."""
    from gearshift.kernels import act_quant

    torch.manual_seed(4)
    for m, k in ((1, 4096), (4, 14336), (16, 4096), (3, 1000)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for spec in (ActQuantSpec("int8"), ActQuantSpec("int4")):
            monkeypatch.setattr(act_quant, "WIDE_ROWS", 0)
            q0, s0 = act_quant.quantize_act_triton(x, spec)
            monkeypatch.setattr(act_quant, "WIDE_ROWS", 64)
            q1, s1 = act_quant.quantize_act_triton(x, spec)
            assert torch.equal(q0, q1) and torch.equal(s0, s1), (m, k, spec)
