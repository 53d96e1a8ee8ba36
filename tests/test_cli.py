"""CLI behaviour: the generate --json contract, quantize round trip, and bad input (exit 2, one line)."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from gearshift.cli import main


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, needle):
    assert code == 2
    lines = [l for l in err.strip().splitlines() if l.startswith("gearshift: error:")]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def test_generate_json_shape(model_dir, capsys):
    code, out, err = cli(capsys, "generate", "--model", str(model_dir("tiny")), "--prompt", "hello", "--prompt",
                         "a longer second prompt", "--max-new-tokens", "5", "--json", "--ignore-eos")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == {"outputs", "stats"} and len(doc["outputs"]) == 2
    for o in doc["outputs"]:
        assert isinstance(o["text"], str) and len(o["token_ids"]) == 5
    assert doc["stats"]["tokens_per_s"] > 0 and doc["stats"]["generated_tokens"] == 10


def test_quantized_checkpoint_of_another_width_is_one_line(model_dir, tmp_path, capsys):
    """A mode whose weight width the checkpoint's quantized linears do not have fails up front, saying
    what to do, instead of announcing a load-time quantization that leaves them as they are."""
    q8 = tmp_path / "q8"
    code, _, err = cli(capsys, "quantize", str(model_dir("tiny")), str(q8), "--weights", "int8")
    assert code == 0, err
    code, _, err = cli(capsys, "generate", "--model", str(q8), "--prompt", "hi", "--max-new-tokens", "2", "--mode", "w4a16")
    assert_one_line_error(code, err, "need 4-bit weights, but")
    assert "quantizing with round-to-nearest" not in err
    code, _, err = cli(capsys, "generate", "--model", str(q8), "--prompt", "hi", "--max-new-tokens", "2", "--mode", "w8a16")
    assert code == 0, err


def test_quantize_group_size_is_checked_and_a_substitute_is_said(model_dir, tmp_path, capsys):
    assert_one_line_error(*cli(capsys, "quantize", str(model_dir("tiny")), str(tmp_path / "q0"), "--group-size", "0")[::2],
                          "--group-size must be at least 16")
    code, _, err = cli(capsys, "quantize", str(model_dir("tiny")), str(tmp_path / "q48"), "--group-size", "48")
    assert code == 0, err
    assert "group size 48 does not divide in_features" in err


@pytest.mark.parametrize("dtype", ["auto", "bf16"])
def test_quantize_round_trip(model_dir, tmp_path, capsys, dtype):
    """A saved checkpoint decodes as on-the-fly quantization does, also where the compute dtype is not the
    source's: on-the-fly quantization of an fp32 source once read its bf16 copy (and the checkpoint's fp32
    lm_head stayed fp32), which gave other tokens on the GPU."""
    out = tmp_path / "q"
    code, _, err = cli(capsys, "quantize", str(model_dir("tiny")), str(out), "--group-size", "32")
    assert code == 0, err
    manifest = json.loads((out / "gearshift.json").read_text())
    assert manifest["layers"]["model.layers.0.self_attn.qkv_proj"]["format"] == "int4g"
    code, o1, _ = cli(capsys, "generate", "--model", str(out), "--prompt", "hi", "--max-new-tokens", "6", "--json",
                      "--ignore-eos", "--quantize", "none", "--dtype", dtype)
    code2, o2, _ = cli(capsys, "generate", "--model", str(model_dir("tiny")), "--prompt", "hi", "--max-new-tokens",
                       "6", "--json", "--ignore-eos", "--group-size", "32", "--dtype", dtype)
    assert code == code2 == 0
    assert json.loads(o1)["outputs"][0]["token_ids"] == json.loads(o2)["outputs"][0]["token_ids"]


@pytest.mark.parametrize("how, mode, fix", [("int8", "w4a16", "--quantize int4"), ("int4", "w8a16", "--quantize int8"),
                                           ("int8", "w16a16", "--quantize none")])
def test_explicit_quantize_of_other_bits_is_one_line(model_dir, capsys, how, mode, fix):
    code, _, err = cli(capsys, "generate", "--model", str(model_dir("tiny")), "--prompt", "hi", "--quantize", how,
                       "--mode", mode)
    assert_one_line_error(code, err, f"--quantize {how} makes")
    assert fix in err


def test_unquantized_checkpoint_quantizes_at_load_as_its_source(model_dir, tmp_path, capsys):
    """A checkpoint saved with --weights none (fp32 here) is quantized at load from its own precision, as the
    HF folder it came from is, also under bf16."""
    out = tmp_path / "dense"
    assert cli(capsys, "quantize", str(model_dir("tiny")), str(out), "--weights", "none")[0] == 0
    runs = []
    for src in (out, model_dir("tiny")):
        code, o, err = cli(capsys, "generate", "--model", str(src), "--prompt", "hi", "--max-new-tokens", "6", "--json",
                           "--ignore-eos", "--group-size", "32", "--dtype", "bf16")
        assert code == 0, err
        runs.append(json.loads(o)["outputs"][0]["token_ids"])
    assert runs[0] == runs[1]


def test_quantize_dtype_sets_the_dense_tensors_not_the_quantization(model_dir, tmp_path, capsys):
    """--dtype bf16 keeps the dense tensors in bf16; the int4 stores are still made from the fp32 source."""
    from safetensors.torch import load_file

    stores = []
    for name, extra in (("f32", []), ("b16", ["--dtype", "bf16"])):
        assert cli(capsys, "quantize", str(model_dir("tiny")), str(tmp_path / name), "--group-size", "32", *extra)[0] == 0
        stores.append(load_file(tmp_path / name / "model.safetensors"))
    quantized = [k for k in stores[0] if ".store." in k and not k.startswith("lm_head")]
    assert quantized and all(torch.equal(stores[0][k], stores[1][k]) for k in quantized)
    assert stores[1]["lm_head.store.weight"].dtype == torch.bfloat16


def test_quantize_on_a_quantized_source_says_it_does_nothing(model_dir, tmp_path, capsys):
    assert cli(capsys, "quantize", str(model_dir("tiny")), str(tmp_path / "q"), "--group-size", "32")[0] == 0
    code, _, err = cli(capsys, "generate", "--model", str(tmp_path / "q"), "--prompt", "hi", "--max-new-tokens", "1",
                       "--quantize", "int4-prog", "--no-chat")
    assert code == 0 and "--quantize int4-prog leaves" in err and "quantized already (4-bit)" in err


def test_profile_times_the_group_the_model_holds(model_dir, tmp_path, capsys):
    """`gearshift profile --model`: a quantized checkpoint's int4 group is the one timed (the engine looks its
    linears up by that group); an HF folder of dense weights and a preset keep 128."""
    from gearshift.cli.profile import read_target
    from gearshift.dispatch.profiler import model_shapes

    assert cli(capsys, "quantize", str(model_dir("tiny")), str(tmp_path / "q"), "--group-size", "32")[0] == 0
    shapes, layers = model_shapes(str(model_dir("tiny")))
    assert read_target(str(tmp_path / "q")) == (shapes, layers, 32)
    assert read_target(str(model_dir("tiny"))) == (shapes, layers, None)
    assert read_target("llama3-8b")[2] is None
    out = tmp_path / "map.json"
    code, _, err = cli(capsys, "profile", "--model", str(tmp_path / "q"), "--m", "1", "--modes", "w4a16",
                       "--out", str(out))
    assert "timing int4 stores of group 32" in err
    if not torch.cuda.is_available():
        assert code == 2 and "CUDA" in err
        return
    keys = json.loads(out.read_text())["entries"]
    assert code == 0 and keys and all(k.startswith("w4a16:g32:") for k in keys)


def test_checkpoint_dense_weights_take_the_compute_dtype(model_dir, tmp_path, capsys):
    from gearshift.model.loader import load_model

    out = tmp_path / "q"
    assert cli(capsys, "quantize", str(model_dir("tiny")), str(out), "--group-size", "32")[0] == 0
    head = load_model(out, dtype=torch.bfloat16, progress=False).model.lm_head.store
    assert head.format_name == "dense" and head.weight.dtype == torch.bfloat16


def test_quantize_int4_prog_round_trip_and_qspec(model_dir, tmp_path, capsys):
    """int4-prog checkpoints keep their row units; QSPEC over them still equals plain W4A16 decoding."""
    out = tmp_path / "qp"
    code, _, err = cli(capsys, "quantize", str(model_dir("tiny")), str(out), "--group-size", "32",
                       "--weights", "int4-prog")
    assert code == 0, err
    manifest = json.loads((out / "gearshift.json").read_text())
    assert manifest["layers"]["model.layers.0.self_attn.qkv_proj"]["meta"].get("row_units") is True
    runs = {}
    for policy in (["--mode", "w4a16"], ["--policy", "qspec"]):
        code, o, err = cli(capsys, "generate", "--model", str(out), "--prompt", "hi", "--max-new-tokens", "6",
                           "--json", "--ignore-eos", *policy)
        assert code == 0, err
        runs[policy[0]] = json.loads(o)["outputs"][0]["token_ids"]
    assert runs["--policy"] == runs["--mode"]


def test_missing_folder(capsys, tmp_path):
    assert_one_line_error(*cli(capsys, "generate", "--model", str(tmp_path / "nope"), "--prompt", "x")[::2],
                          "does not exist")


def test_missing_weights(model_dir, tmp_path, capsys):
    d = tmp_path / "m"
    shutil.copytree(model_dir("tiny"), d)
    (d / "model.safetensors").unlink()
    assert_one_line_error(*cli(capsys, "generate", "--model", str(d), "--prompt", "x")[::2], "no *.safetensors")


def test_truncated_weights(model_dir, tmp_path, capsys):
    d = tmp_path / "m"
    shutil.copytree(model_dir("tiny"), d)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    assert_one_line_error(*cli(capsys, "generate", "--model", str(d), "--prompt", "x")[::2], "truncated")


def test_unknown_architecture(model_dir, tmp_path, capsys):
    d = tmp_path / "m"
    shutil.copytree(model_dir("tiny"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["BertForMaskedLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(*cli(capsys, "generate", "--model", str(d), "--prompt", "x")[::2], "BertForMaskedLM")


def test_prompt_longer_than_context(model_dir, capsys):
    assert_one_line_error(*cli(capsys, "generate", "--model", str(model_dir("tiny")), "--prompt", "word " * 800)[::2],
                          "the context holds 512")


def test_unknown_mode(model_dir, capsys):
    assert_one_line_error(*cli(capsys, "generate", "--model", str(model_dir("tiny")), "--prompt", "x", "--mode",
                               "w3a5")[::2], "unknown precision mode")


def test_quantize_failure_writes_nothing(model_dir, tmp_path, capsys):
    d = tmp_path / "m"
    shutil.copytree(model_dir("tiny"), d)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    out = tmp_path / "out"
    assert_one_line_error(*cli(capsys, "quantize", str(d), str(out))[::2], "truncated")
    assert not out.exists() and not list(tmp_path.glob(".out.*"))


def test_subprocess_exit_code_and_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gearshift", "generate", "--model", str(tmp_path / "missing"),
                        "--prompt", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_tiny_model_refuses_nonempty(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("keep")
    assert_one_line_error(*cli(capsys, "tiny-model", str(tmp_path / "x"))[::2], "not empty")
    assert_one_line_error(*cli(capsys, "tiny-model", str(tmp_path / "y"), "--config", "nope")[::2], "unknown model preset")


def test_int4_prog_hint_only_for_quantized_activations_on_hopper(monkeypatch):
    import torch

    from gearshift.cli.common import int4_prog_hint

    assert int4_prog_hint(["w4a8"], "cpu") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    assert "int4-prog" in int4_prog_hint(["w4a16", "w4a8"], "cuda")
    assert "int4-prog" in int4_prog_hint(["w4a4"], "cuda:0")
    assert int4_prog_hint(["w4a16"], "cuda") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    assert int4_prog_hint(["w4a8"], "cuda") is None


def test_profile_unknown_strategy_is_one_line(capsys):
    """Bad arguments fail before the GPU check, so they read the same on any machine."""
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--strategies", "w4a16_mma,nope")[::2],
                          "unknown strategies ['nope']")
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--modes", "w4a16,w4a8", "--strategies",
                               "w4a16_mma")[::2], "serves mode(s) ['w4a8']")


def test_profile_bad_seed_is_one_line(capsys, tmp_path):
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--seed", str(tmp_path / "nope.json"))[::2],
                          "cannot read the seed map")
    (tmp_path / "empty.json").write_text('{"device": "x"}')
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--seed", str(tmp_path / "empty.json"))[::2],
                          "holds no candidate timings")
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--seed", "auto", "--top", "0")[::2],
                          "--top must be at least 1")


def test_profile_new_tiles_needs_a_seed(capsys):
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--new-tiles")[::2], "--new-tiles only")


def test_profile_refine_arguments_are_checked_before_any_gpu_work(capsys):
    assert_one_line_error(*cli(capsys, "profile", "--shapes", "64x256", "--refine", "1")[::2], "give --model")
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--refine-only")[::2], "--refine-only needs")
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--refine", "3")[::2], "must be M buckets")
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--refine", "1,x")[::2], "batch sizes like")
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--refine", "1", "--refine-top", "1")[::2],
                          "--refine-top must be")
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--refine", "1", "--refine-context", "0")[::2],
                          "--refine-context must be")
    assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", "--refine", "1", "--group-size", "-1")[::2],
                          "--group-size above 0")


def test_profile_lists_are_checked_before_the_gpu(capsys):
    """--m, --modes, --shapes and --sustain typos read as one line on any machine, not as a traceback on a GPU."""
    for args, msg in ((("--m", "1,abc"), "--m: 'abc' is not a token count"), (("--m", "0"), "--m: '0'"),
                      (("--modes", "w4a16,w9a9"), "--modes: unknown ['w9a9']"),
                      (("--shapes", "4096x"), "--shapes: '4096x' is not NxK"),
                      (("--sustain", "-1"), "--sustain must be 0 (off)"),
                      (("--sustain-from", "0"), "--sustain-from must be a token count")):
        assert_one_line_error(*cli(capsys, "profile", "--model", "llama3-8b", *args)[::2], msg)


def test_profile_needs_a_model_or_shapes(capsys):
    assert_one_line_error(*cli(capsys, "profile")[::2], "say what to profile")


def test_profile_extends_this_gpus_map(tmp_path, monkeypatch):
    """A profile run extends the map of this GPU at its output path (at the default path with none
    there yet, the shipped one), refuses another GPU's, and reads no map for a fresh path."""
    from gearshift.cli.profile import extend_base
    from gearshift.dispatch.policy import PolicyMap
    from gearshift.errors import GearshiftError

    monkeypatch.setattr("gearshift.dispatch.policy.bundled_dir", lambda: tmp_path / "bundled")
    PolicyMap("Toy GPU", meta={"shipped": True}).save(tmp_path / "bundled" / "Toy_GPU.json")
    out = tmp_path / "cache" / "Toy_GPU.json"
    assert extend_base(out, "Toy GPU", default_out=True).meta == {"shipped": True}
    monkeypatch.setattr("gearshift.dispatch.policy.triton_version", lambda: "3.9.0")
    PolicyMap("Toy GPU", meta={"shipped": "3.9"}).save(tmp_path / "bundled" / "Toy_GPU.triton3.9.json")
    assert extend_base(out, "Toy GPU", default_out=True).meta == {"shipped": "3.9"}  # this Triton's first
    monkeypatch.setattr("gearshift.dispatch.policy.triton_version", lambda: "3.6.0")
    assert extend_base(out, "Toy GPU", default_out=True).meta == {"shipped": True}
    assert extend_base(out, "Toy GPU", default_out=False) is None  # an explicit new path: fresh
    assert extend_base(out, "Other GPU", default_out=True) is None
    PolicyMap("Toy GPU", meta={"mine": True}).save(out)
    assert extend_base(out, "Toy GPU", default_out=True).meta == {"mine": True}
    with pytest.raises(GearshiftError, match="not this Other GPU"):
        extend_base(out, "Other GPU", default_out=False)
    out.write_text("[]")
    with pytest.raises(GearshiftError, match="not a policy map"):
        extend_base(out, "Toy GPU", default_out=True)


def test_a_profile_of_some_points_says_where_the_rest_come_from(tmp_path, monkeypatch):
    """After a run that wrote a map of a few points, profile says how many of the points the engine
    will run come from another GPU's map of the same architecture; nothing when none do."""
    from gearshift.cli.profile import filled_note
    from gearshift.dispatch.policy import Choice, PolicyMap

    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("gearshift.dispatch.policy.bundled_dir", lambda: tmp_path / "bundled")
    monkeypatch.setattr("gearshift.dispatch.policy.gpu_traits", lambda *a: {"capability": "9.0", "sms": 132})
    big = PolicyMap("Big GPU", meta={"capability": "9.0", "sms": 132})
    for m in (1, 2, 4):
        big.set("w4a16:g128:64x256", m, Choice("theirs", None))
    big.save(tmp_path / "bundled" / "Big_GPU.json")
    mine = PolicyMap("New GPU", meta={"capability": "9.0", "sms": 132})
    mine.set("w4a16:g128:64x256", 4, Choice("mine", None))
    mine.save(tmp_path / "out.json")
    assert filled_note(tmp_path / "out.json") == (
        "this map holds 1 of the 3 points the engine runs from it here; it takes the other 2 from the map of "
        "Big GPU (same architecture) when it loads")
    for m in (1, 2):
        mine.set("w4a16:g128:64x256", m, Choice("mine", None))
    mine.save(tmp_path / "out.json")
    assert filled_note(tmp_path / "out.json") is None


def test_a_seed_from_another_triton_release_is_flagged(monkeypatch):
    from gearshift.cli.profile import seed_release_note
    from gearshift.dispatch.policy import PolicyMap

    monkeypatch.setattr("gearshift.dispatch.policy.triton_version", lambda: "3.9.0")
    note = seed_release_note(PolicyMap("Toy GPU", meta={"triton": "3.6.0"}), 8)
    assert "Triton 3.6.0" in note and "Triton 3.9" in note and "--top 8" in note
    assert seed_release_note(PolicyMap("Toy GPU", meta={"triton": "3.9.1"}), 8) is None
    assert seed_release_note(PolicyMap("Toy GPU"), 8) is None  # a map that does not say


def test_extending_a_map_keeps_its_other_points_and_the_fastest_timing():
    import torch

    from gearshift.dispatch.policy import Choice, PolicyMap, candidate_name, type_key
    from gearshift.dispatch.profiler import profile
    from gearshift.dispatch.strategies import STRATEGIES, DPRPartition, Strategy, register
    from gearshift.kernels.reference import linear_reference

    key, other = type_key("w4a16", 128, 64, 256), type_key("w4a16", 128, 4096, 4096)
    base = PolicyMap("test")
    base.set(other, 1, Choice("w4a16_tc", None, 1.0))
    base.timings[key] = {"1": {"old_fast": 0.5}}
    register(Strategy("test_new", DPRPartition((4,), (16,), "any", "library"), ("w4a16",),
                      lambda x, st, act, cfg: linear_reference(x.float(), st, act).to(x.dtype), gpu_only=False))
    try:
        pm = profile([("s", 64, 256)], ["w4a16"], [1], group=128, device_name="test", strategies=["test_new"],
                     dtype=torch.float32, int4_layout="rows", timer=lambda calls: 2.0, device="cpu", policy=base)
    finally:
        STRATEGIES.pop("test_new")
    assert pm.lookup(other, 1).strategy == "w4a16_tc"  # another shape's entry is kept
    assert pm.timings[key]["1"] == {"old_fast": 0.5, candidate_name("test_new", None): 2.0}
    assert pm.lookup(key, 1).strategy == "old_fast"  # the fastest over old and new timings


def test_an_interrupted_profile_resumes_where_it_stopped(tmp_path, monkeypatch, capsys):
    """`gearshift profile` saves every finished point to <out>.partial; an interrupted run leaves it
    there (not the map itself), and --resume times only the missing points, but only for the same
    arguments."""
    import os
    import signal

    import torch

    import gearshift.dispatch.profiler as profiler
    from gearshift.dispatch.policy import PolicyMap, type_key
    from gearshift.dispatch.strategies import STRATEGIES, DPRPartition, Strategy, register
    from gearshift.kernels.reference import linear_reference

    timed, stop_at = [], [2]

    def timer(calls):  # the third timing is stopped as `timeout` stops a run (SIGTERM; Ctrl-C alike)
        if len(timed) == stop_at[0]:
            os.kill(os.getpid(), signal.SIGTERM)
        timed.append(calls)
        return float(len(timed))

    real = profiler.profile
    monkeypatch.setattr(profiler, "profile", lambda *a, **kw: real(*a, **{**kw, "device": "cpu", "timer": timer,
                                                                          "dtype": torch.float32,
                                                                          "int4_layout": "rows"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Toy GPU")
    monkeypatch.setattr("gearshift.dispatch.policy.gpu_traits", lambda *a: {"capability": "0.0", "sms": 1})  # no kin
    register(Strategy("test_cpu", DPRPartition((4,), (16,), "any", "library"), ("w4a16",),
                      lambda x, st, act, cfg: linear_reference(x.float(), st, act).to(x.dtype), gpu_only=False))
    out, partial = tmp_path / "map.json", tmp_path / "map.json.partial"
    args = ["profile", "--shapes", "64x256", "--modes", "w4a16", "--strategies", "test_cpu", "--out", str(out)]
    try:
        code, _, err = cli(capsys, *args, "--m", "1,2,4")
        assert code == 130 and "interrupted after 2 of 3 points" in err and "--resume" in err
        assert not out.exists() and sorted(PolicyMap.load(partial).meta["partial"]["done"]) == [
            f"{type_key('w4a16', 128, 64, 256)} M={m}" for m in (1, 2)]
        assert_one_line_error(*cli(capsys, *args, "--m", "1,2", "--resume")[::2], "m: saved [1, 2, 4], now [1, 2]")
        stop_at[0] = 99
        code, _, err = cli(capsys, *args, "--m", "1,2,4", "--resume")
        assert code == 0, err
        assert "2 of 3 points done" in err and len(timed) == 3  # only M = 4 was timed again
        pm = PolicyMap.load(out)
        key = type_key("w4a16", 128, 64, 256)
        assert [pm.lookup(key, m).us for m in (1, 2, 4)] == [1.0, 2.0, 3.0]
        assert "partial" not in pm.meta and pm.meta["model"] == "--shapes" and not partial.exists()
        assert_one_line_error(*cli(capsys, *args, "--m", "1,2,4", "--resume")[::2], "nothing to resume")
    finally:
        STRATEGIES.pop("test_cpu")


def test_gearshift_warnings_are_one_line(capsys, monkeypatch):
    """The CLI shows gearshift's own warnings as one `gearshift: warning:` line, without the echo of the
    source line that raised them; other packages' warnings go to Python's display as before."""
    import warnings

    from gearshift.cli import one_line_warnings
    from gearshift.quant.detect import DoubleQuantizationWarning

    passed_on = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, category, *a, **k: passed_on.append(category))
    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with one_line_warnings():
            warnings.warn("layer x looks already quantized", DoubleQuantizationWarning)
            warnings.warn("a deprecation elsewhere", DeprecationWarning)
    assert capsys.readouterr().err == "gearshift: warning: layer x looks already quantized\n"
    assert passed_on == [DeprecationWarning] and warnings.showwarning is before


def test_help_wraps_long_description_lines_and_keeps_examples(monkeypatch):
    """Every verb's --help fits the terminal: long description lines wrap, indented example lines stay whole."""
    import io
    from contextlib import redirect_stdout

    from gearshift.cli import VERBS, build_parser

    monkeypatch.setenv("COLUMNS", "90")
    for verb in VERBS:
        out = io.StringIO()
        with redirect_stdout(out), pytest.raises(SystemExit):
            build_parser().parse_args([verb.replace("_", "-"), "--help"])
        long = [line for line in out.getvalue().splitlines() if len(line) > 90 and not line.startswith("  ")]
        assert not long, (verb, long)


def test_qspec_on_small_int4_groups_says_it_will_not_pay(capsys):
    """No map estimates QSPEC on group-32 shapes, so on a GPU the CLI says what group 32 drafts on; not on CPU."""
    import types

    from gearshift.cli.policy_qspec import group_note
    from gearshift.model.quant_linear import QuantLinear
    from gearshift.quant.int4 import quantize_int4

    lins = [("a", QuantLinear(quantize_int4(torch.randn(64, 128), 32))),
            ("b", QuantLinear(quantize_int4(torch.randn(64, 128), 128)))]
    for dev, said in (("cuda", True), ("cpu", False)):
        model = types.SimpleNamespace(device=torch.device(dev), linear_layers=lambda: iter(lins))
        group_note(model, "w4a8")
        err = capsys.readouterr().err
        assert ("1 of the 2 int4 linears hold groups under 128" in err and "expect no speed-up" in err) == said


def test_penalties_are_checked_before_the_model_loads(capsys):
    for argv, words in ((["--policy", "qspec", "--repetition-penalty", "1.2"], "need --policy ar"),
                        (["--frequency-penalty", "5"], "[-2, 2]"), (["--repetition-penalty", "0"], "> 0")):
        code, _, err = cli(capsys, "generate", "--model", "/nonexistent/model", "--prompt", "hi", *argv)
        assert code == 2 and words in err and "nonexistent" not in err, err
