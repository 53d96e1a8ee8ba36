"""`gearshift bench`: rows for every (policy, batch), QSPEC's greedy tokens checked against ar's."""

import json

import pytest

from gearshift.cli import main


def test_bench_rows_and_json(model_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(["bench", "--model", str(model_dir("tiny")), "--device", "cpu", "--policy", "ar,qspec",
                 "--draft-mode", "w4a8", "--batch-size", "1,2", "--prompt-len", "6", "--gen-len", "5",
                 "--repeat", "1", "--json", str(out)])
    assert code == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["policy", "mode", "batch"] and len(table) == 5
    d = json.loads(out.read_text())
    assert d["device"] == "cpu" and d["prompt_len"] == 6
    rows = d["rows"]
    assert [(r["policy"], r["batch"]) for r in rows] == [("ar", 1), ("qspec", 1), ("ar", 2), ("qspec", 2)]
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["ttft_ms"] > 0 and len(r["wall_s_runs"]) == 1
    qspec = [r for r in rows if r["policy"] == "qspec"]
    assert all(r["same_tokens_as_ar"] is True and r["speedup_vs_ar"] > 0 and 0 <= r["acceptance_rate"] <= 1
               for r in qspec)


@pytest.mark.parametrize("argv, words", [
    (["--batch-size", "0"], "positive integers"),
    (["--policy", "ar,nope"], "unknown policy nope"),
])
def test_bench_option_errors(model_dir, capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--model", str(model_dir("tiny")), *argv])
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_bench_longer_than_the_context(model_dir, capsys):
    code = main(["bench", "--model", str(model_dir("tiny")), "--device", "cpu", "--policy", "ar",
                 "--prompt-len", "400", "--gen-len", "200"])
    assert code == 2 and "context holds 512" in capsys.readouterr().err


def test_bench_scores_where_qspec_parts_from_ar(model_dir, tmp_path, capsys, monkeypatch):
    """Where QSPEC's greedy tokens differ from ar's, bench scores the first differing position in the verify
    mode and says whether it is a floating-point tie (contract 1: ties are reported, not hidden). Here QSPEC's
    third token is replaced by the verify mode's runner-up there: no tie."""
    import torch

    from gearshift.cli import bench
    from gearshift.engine.divergence import first_divergence

    real = bench.time_policy
    seen = {}

    def altered(engine, policy, prompts, gen_len, repeat):
        row, tokens = real(engine, policy, prompts, gen_len, repeat)
        if row["policy"] == "qspec":
            model = engine.loaded.model
            ids = prompts[0] + tokens[0][:2]
            cache = model.new_cache(1, len(ids) + 1)
            logits = model.forward_lists(torch.tensor([ids]), cache, [0], [len(ids)], len(ids), "w4a16", "last")
            tokens = [list(t) for t in tokens]
            tokens[0][2] = int(logits[0, -1].float().topk(2).indices[1])
            seen["model"] = model
        return row, tokens

    monkeypatch.setattr(bench, "time_policy", altered)
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(model_dir("tiny")), "--device", "cpu", "--policy", "ar,qspec",
                 "--draft-mode", "w4a8", "--batch-size", "1", "--prompt-len", "6", "--gen-len", "5",
                 "--repeat", "1", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert "sequence 0 first differs at generated token 2" in err and "no tie: a bug worth reporting" in err
    (q,) = [r for r in json.loads(out.read_text())["rows"] if r["policy"] == "qspec"]
    div = q["first_divergence"]
    assert q["same_tokens_as_ar"] is False and div["position"] == 2 and div["tie"] is False
    assert div["gap"] > 0 and div["top_token"] == div["ar_token"]
    assert first_divergence(seen["model"], [[1, 2]], [[3, 4]], [[3, 4]], "w4a16") is None
    assert first_divergence(seen["model"], [[1, 2]], [[3, 4]], [[3, 4, 5]], "w4a16") is None  # length only
