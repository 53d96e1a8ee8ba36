"""`gearshift generate --interactive`: turns read from input, the conversation kept, /reset and /exit."""

import io
import json
import shutil

import pytest

from gearshift.cli import main
from gearshift.cli.interactive import run_interactive
from gearshift.decode.autoregressive import AutoregressivePolicy
from gearshift.decode.sampling import SamplingParams
from gearshift.engine.engine import Engine
from gearshift.model.loader import load_model


@pytest.fixture(scope="module")
def chat_engine(model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "model"
    shutil.copytree(model_dir("tiny"), path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                            "{% if add_generation_prompt %}<assistant>{% endif %}")
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    loaded = load_model(str(path), quantize="int4", device="cpu")
    return Engine(loaded, max_batch=1, max_seq_len=256)


def _talk(engine, text, chat=None, system=None, first=()):
    """Run a conversation from `text`; returns the exit code, what was written, the contents of each encoded
    conversation, the error stream and each admitted sequence's (prompt, reused prompt tokens)."""
    seen = []
    encode = engine.encode_chat

    def recording(messages):
        seen.append([m["content"] for m in messages])
        return encode(messages)

    engine.encode_chat = recording
    policy = AutoregressivePolicy(engine.model, "w4a16")
    prefill = policy.prefill
    admitted = []

    def counting(seqs, sample):
        admitted.extend((list(s.prompt), s.cached) for s in seqs)
        return prefill(seqs, sample)

    policy.prefill = counting
    out, err = io.StringIO(), io.StringIO()
    try:
        code = run_interactive(engine, policy, lambda: SamplingParams(max_new_tokens=4, ignore_eos=True), chat,
                               system, list(first), stdin=io.StringIO(text), stdout=out, stderr=err)
    finally:
        del engine.encode_chat
    return code, out.getvalue(), seen, err.getvalue(), admitted


def test_turns_keep_the_conversation_and_reset_forgets_it(chat_engine):
    code, out, seen, err, calls = _talk(chat_engine, "hello\nmore\n/reset\nagain\n", system="be brief", first=["first"])
    assert code == 0 and len(seen) == len(calls) == 4  # one encoding and one generation per turn
    assert calls[0][1] == 0 and calls[1][1] >= len(calls[0][0]) and calls[1][0][:calls[1][1]] == \
        calls[0][0][:calls[1][1]]  # the second turn starts from the first one's K/V
    assert [s[0] for s in seen] == ["be brief"] * 4  # the system message stays through /reset
    assert seen[1][1:4:2] == ["first", "hello"] and seen[1][2] and out.startswith(seen[1][2])  # turns and replies
    assert seen[2][-1] == "more" and len(seen[2]) == 6
    assert seen[3] == ["be brief", "again"] and "forgotten" in err


def test_exit_and_raw_completion(chat_engine):
    code, out, seen, err, calls = _talk(chat_engine, "one\n/exit\ntwo\n", chat=False)
    assert code == 0 and seen == [] and "raw completion" in err
    assert [c[0] for c in calls] == [chat_engine.encode_prompt("one", chat=False)]  # nothing after /exit


def test_interactive_refuses_json(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir("tiny")), "--device", "cpu", "-i", "--json"]) == 2
    assert "--json" in capsys.readouterr().err


def test_ctrl_c_stops_the_reply_and_the_conversation_goes_on(chat_engine):
    """SIGINT while a reply decodes ends that reply at the next step ('[stopped]'); the next turn still runs."""
    import signal

    policy = AutoregressivePolicy(chat_engine.model, "w4a16")
    step = policy.step
    steps = []

    def interrupting(seqs, sample):
        steps.append(len(seqs[0].output))
        if len(steps) == 2:
            signal.raise_signal(signal.SIGINT)
        return step(seqs, sample)

    policy.step = interrupting
    out, err = io.StringIO(), io.StringIO()
    code = run_interactive(chat_engine, policy, lambda: SamplingParams(max_new_tokens=30, ignore_eos=True), None,
                           None, [], stdin=io.StringIO("one\ntwo\n"), stdout=out, stderr=err)
    assert code == 0 and out.getvalue().count("[stopped]") == 1
    assert len(steps) <= 3 + 30 and steps.count(0) == 2  # the first reply was cut short; the second one ran


def test_interactive_refuses_trace_out(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir("tiny")), "--device", "cpu", "-i", "--policy", "gearbox",
                 "--trace-out", "x.png"]) == 2
    assert "--trace-out" in capsys.readouterr().err
