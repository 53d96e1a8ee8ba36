"""GEARBX decode policy: lossless high gear, exact forced low gear, batch rules, sampling, telemetry, CLI."""

import json

import pytest
import torch

from gearshift.decode.autoregressive import AutoregressivePolicy
from gearshift.decode.gearbox import GearboxPolicy, parse_gears
from gearshift.decode.sampling import SamplingParams
from gearshift.engine.engine import Engine, Request
from gearshift.model.loader import load_model
from gearshift.quant.rowwise import quantize_rowwise

PROMPTS = [[1, 5, 7, 9, 11, 13, 2], [3, 4, 8, 100, 200], [17, 30, 31, 250, 9, 9, 9, 12, 60], [42]]
NO_CATASTROPHE = dict(catastrophic_fraction=2.0)  # random tiny models are near-uniform: keep fallback off


def requests(n=8, prompts=PROMPTS, **kw):
    return [Request(list(p), SamplingParams(max_new_tokens=n, ignore_eos=True, **kw)) for p in prompts]


def run(loaded, policy, batch=2, **kw):
    eng = Engine(loaded, max_batch=batch)
    res = eng.generate(requests(**kw), policy)
    return res, eng.last_stats


@pytest.fixture(scope="module")
def dense(model_dir):
    return load_model(model_dir("tiny"), progress=False)


def test_parse_gears():
    assert parse_gears("high,low") == ("low", "high")
    with pytest.raises(ValueError):
        parse_gears("turbo")


def test_high_gear_greedy_equals_ar_w16a16(dense):
    ar, _ = run(dense, AutoregressivePolicy(dense.model, "w16a16"))
    gb, st = run(dense, GearboxPolicy(dense.model, gears="high"))
    assert [r.token_ids for r in gb] == [r.token_ids for r in ar]
    assert st["gear_counts"]["high"] == sum(len(r.token_ids) for r in gb) and st["shift_count"] == 0


def test_high_gear_equals_ar_w4a16_on_int4_model(model_dir):
    q = load_model(model_dir("tiny"), quantize="int4", group_size=32, progress=False)
    ar, _ = run(q, AutoregressivePolicy(q.model, "w4a16"))
    gb, _ = run(q, GearboxPolicy(q.model, gears="high"))
    assert [r.token_ids for r in gb] == [r.token_ids for r in ar]


def test_forced_low_gear_equals_manual_rowwise_int4(model_dir, dense):
    manual = load_model(model_dir("tiny"), progress=False)
    for name, lin in manual.model.linear_layers():
        if "self_attn" in name:
            lin.set_store(quantize_rowwise(lin.store.weight, 4))
    ref, _ = run(manual, AutoregressivePolicy(manual.model, "native"))
    pol = GearboxPolicy(dense.model, gears="low")
    gb, st = run(dense, pol)
    assert [r.token_ids for r in gb] == [r.token_ids for r in ref]
    assert st["gear_counts"]["low"] == sum(len(r.token_ids) for r in gb)
    pol.close()  # back to the unmodified model for the other tests
    ar, _ = run(dense, AutoregressivePolicy(dense.model, "w16a16"), prompts=PROMPTS[:2], n=4)
    hi, _ = run(dense, GearboxPolicy(dense.model, gears="high"), prompts=PROMPTS[:2], n=4)
    assert [r.token_ids for r in hi] == [r.token_ids for r in ar]


def test_shifts_follow_the_monitor_and_sequences_join_and_leave(dense):
    # thresholds far above the tiny model's ~9-bit entropies: every sequence wants low after the
    # minimum duration; starting high, each row shifts high -> low once
    pol = GearboxPolicy(dense.model, initial_gear="high", calibrate=False, min_gear_duration=3,
                        monitor_kwargs=dict(theta_low=30, theta_high=40, **NO_CATASTROPHE))
    res, st = run(dense, pol, n=8)
    for r in res:
        tr = r.stats["gearbox"]
        assert len(tr["entropy"]) == len(tr["gear"]) == len(r.token_ids) == 8
        assert tr["wanted_gear"][:3] == ["high"] * 3 and tr["wanted_gear"][3:] == ["low"] * 5
        assert tr["initial_gear"] == "high" and tr["shifts"] == 1
        assert all(0 <= h <= 9.0 for h in tr["entropy"])
    assert st["sequence_shifts"] == 4
    assert st["gear_counts"]["low"] > 0 and st["gear_counts"]["high"] >= 12
    assert st["shift_count"] >= 2 and st["shift_cost_s"] >= 0
    assert st["prewarms"] == 1 and st["shift_cost_by_kind"]["prewarm"]["count"] == 1
    assert "quantize" not in st["shift_cost_by_kind"]  # pre-warming made the first entry a cached one
    pol.close()


def test_calibration_from_prefill(dense):
    pol = GearboxPolicy(dense.model, initial_gear="high", gears="high")
    res, _ = run(dense, pol, n=2)
    log2v = 9.0
    for r, p in zip(res, PROMPTS):
        tr = r.stats["gearbox"]
        if len(p) >= 6:  # >= 5 prefill positions
            assert tr["calibrated"] is True
            assert tr["theta_low"] <= 0.06 * log2v + 1e-4 and tr["theta_high"] <= 0.12 * log2v + 1e-4
        if len(p) == 1:
            assert tr["calibrated"] is False


def _mixed(dense, rule):
    texts = ["hi there friend", "Prove that the integral of x^2 + 3*x = y/2 - 1 step by step"]
    pol = GearboxPolicy(dense.model, prompt_texts=texts, batch_rule=rule, calibrate=False, min_gear_duration=1000,
                        monitor_kwargs=NO_CATASTROPHE)
    eng = Engine(dense, max_batch=2)
    res = eng.generate([Request([1, 5, 7, 9], SamplingParams(max_new_tokens=10, ignore_eos=True)),
                        Request([3, 4, 8, 100], SamplingParams(max_new_tokens=10, ignore_eos=True))], pol)
    pol.close()
    return res, eng.last_stats


def test_batch_rule_max_vs_split(dense):
    res_max, st_max = _mixed(dense, "max")
    assert [r.stats["gearbox"]["initial_gear"] for r in res_max] == ["low", "high"]
    # max: one forward per step, in the highest wanted gear; the easy sequence is upgraded
    assert st_max["gear_counts"] == {"low": 0, "mid": 0, "high": 20}
    assert st_max["wanted_gear_counts"] == {"low": 10, "mid": 0, "high": 10}
    assert st_max["forwards_by_gear"]["high"] == 10
    res_split, st_split = _mixed(dense, "split")
    # split: each sequence runs in its own gear, two forwards per step, all gears resident
    assert st_split["gear_counts"] == {"low": 10, "mid": 0, "high": 10}
    assert st_split["forwards_by_gear"] == {"low": 10, "mid": 0, "high": 10}
    assert res_split[0].stats["gearbox"]["gear"] == ["low"] * 10
    assert st_split["offload_originals"] is False and st_split["cache_device"] == "device"
    # the hard sequence ran in high gear under both rules: same tokens
    assert res_split[1].token_ids == res_max[1].token_ids


def test_sampling_min_p_gumbel(dense):
    pol = lambda: GearboxPolicy(dense.model, gears="high")  # noqa: E731
    kw = dict(prompts=PROMPTS[:2], n=6, temperature=0.8, min_p=0.05)
    a, _ = run(dense, pol(), seed=7, **kw)
    b, _ = run(dense, pol(), seed=7, **kw)
    c, _ = run(dense, pol(), seed=8, **kw)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]
    # min-p near 1 keeps only the argmax: equal to greedy
    g, _ = run(dense, pol(), prompts=PROMPTS[:2], n=6)
    m, _ = run(dense, pol(), prompts=PROMPTS[:2], n=6, temperature=1.0, min_p=0.9999, seed=3)
    assert [r.token_ids for r in m] == [r.token_ids for r in g]


def test_nan_guard_in_sampling(dense):
    pol = GearboxPolicy(dense.model, gears="high")
    from gearshift.decode.base import Sequence
    from gearshift.decode.gumbel import sanitize_logits

    z = torch.tensor([[float("nan"), 1.0, float("inf"), -float("inf")]])
    s = Sequence(0, [1], SamplingParams(temperature=1.0), slot=0, generator=torch.Generator().manual_seed(0))
    ids = pol._sample(sanitize_logits(z), [s])
    assert ids.tolist() == [2]


def test_cli_generate_json_telemetry_and_trace(model_dir, tmp_path, capsys):
    from gearshift.cli import main

    png = tmp_path / "gen.png"
    rc = main(["generate", "--model", str(model_dir("tiny")), "--policy", "gearbox", "--json", "--prompt", "hello",
               "--prompt", "solve 3*x + 2 = 11", "--max-new-tokens", "10", "--ignore-eos", "--min-gear-duration", "2",
               "--theta-low", "30", "--theta-high", "40", "--trace-out", str(png)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    st = out["stats"]
    for k in ("gear_counts", "gear_distribution", "shift_count", "shift_cost_s", "shift_cost_by_kind",
              "managed_device_bytes_by_gear", "sequence_shifts", "batch_rule", "shifts"):
        assert k in st, k
    assert st["policy"] == "gearbox" and st["mode"] == "native"
    for o in out["outputs"]:
        tr = o["stats"]["gearbox"]
        assert len(tr["entropy"]) == len(tr["gear"]) == len(o["token_ids"])
        assert {"mean_entropy", "wanted_gear", "theta_low", "theta_high", "initial_gear"} <= set(tr)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    js = tmp_path / "out.json"
    js.write_text(json.dumps(out))
    png2 = tmp_path / "trace.png"
    assert main(["trace", str(js), "--out", str(png2)]) == 0
    assert png2.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    png3 = tmp_path / "trace3.png"
    assert main(["trace", "--out", str(png3), "--generate", "--model", str(model_dir("tiny")), "--prompt", "hi",
                 "--max-new-tokens", "4"]) == 0
    assert png3.exists()


def test_trace_rejects_non_gearbox_json(tmp_path, capsys):
    from gearshift.cli import main

    js = tmp_path / "x.json"
    js.write_text(json.dumps({"outputs": [{"text": "a", "token_ids": [1]}], "stats": {}}))
    assert main(["trace", str(js), "--out", str(tmp_path / "x.png")]) == 2
    assert "no gearbox trace" in capsys.readouterr().err


@pytest.mark.parametrize("rule", ["max", "split"])
def test_one_step_ahead_gives_the_same_tokens_and_telemetry(dense, rule):
    """GEARBX's run-ahead loop (on by default on CUDA; forced here on the CPU, where it runs the same
    bookkeeping synchronously) against the step-by-step loop: same tokens, entropies and gears under
    shifts (every row goes high -> low after the minimum duration, so the steps launched ahead in high
    gear are dropped and recomputed), sequences joining and leaving a batch of 2, and a sampled row."""
    def make(pipelined):
        return GearboxPolicy(dense.model, initial_gear="high", calibrate=False, min_gear_duration=3,
                             batch_rule=rule, pipelined=pipelined,
                             monitor_kwargs=dict(theta_low=30, theta_high=40, **NO_CATASTROPHE))

    reqs = lambda: requests(n=8) + [Request([5, 6, 7], SamplingParams(max_new_tokens=6, temperature=0.9,  # noqa: E731
                                                                       seed=11, ignore_eos=True))]
    out = {}
    for pipelined in (False, True):
        pol = make(pipelined)
        eng = Engine(dense, max_batch=2)
        res = eng.generate(reqs(), pol)
        pol.close()
        out[pipelined] = (res, eng.last_stats, pol)
    (plain, st0, _), (ahead, st1, pol) = out[False], out[True]
    assert [r.token_ids for r in ahead] == [r.token_ids for r in plain]
    for a, p in zip(ahead, plain):
        for key in ("entropy", "gear", "wanted_gear"):
            assert a.stats["gearbox"][key] == p.stats["gearbox"][key], key
    assert st1["gear_counts"] == st0["gear_counts"] and st1["gear_counts"]["low"] > 0
    assert st0["discarded_forwards"] == 0
    assert st1["discarded_forwards"] >= 1  # shifts and joining sequences drop the step launched ahead
    assert st1["forwards"] == st0["forwards"]  # the steps whose tokens were used, recomputations included



def test_joining_sequences_far_apart_prefill_and_calibrate_apart(dense):
    """GEARBX prefills sequences joining slots 0 and 3 around running ones in a forward each
    (`DecodePolicy.prefill_groups`), and calibrates each from its own rows: the same tokens, gears and
    thresholds as one forward over slots 0..3."""
    prompts = [[5, 6], list(range(3, 13)), list(range(20, 30)), [7, 8], list(range(40, 111)), list(range(120, 191))]
    lengths = [3, 9, 9, 3, 4, 4]
    outs = []
    for split in (128, 10**9):
        pol = GearboxPolicy(dense.model, monitor_kwargs=NO_CATASTROPHE)
        pol.split_prefill_rows = split
        res = Engine(dense, max_batch=4).generate(
            [Request(q, SamplingParams(max_new_tokens=n, ignore_eos=True)) for q, n in zip(prompts, lengths)], pol)
        gb = [r.stats["gearbox"] for r in res]
        outs.append(([r.token_ids for r in res], [(g["gear"], g["calibrated"], g["theta_low"]) for g in gb],
                     pol.counters["forwards"]))
    assert outs[0][:2] == outs[1][:2]
    assert outs[0][2] == outs[1][2] + 1  # the refill took two prefill forwards instead of one
