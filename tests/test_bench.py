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
