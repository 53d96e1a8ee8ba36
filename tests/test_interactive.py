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
    return Engine(loaded, max_batch=1)


def _talk(engine, text, chat=None, system=None, first=()):
    seen = []
    encode = engine.encode_chat

    def recording(messages):
        seen.append([m["content"] for m in messages])
        return encode(messages)

    engine.encode_chat = recording
    generate = engine.generate
    calls = []

    def counting(requests, policy, on_event=None):
        calls.append(requests[0].prompt_ids)
        return generate(requests, policy, on_event=on_event)

    engine.generate = counting
    out, err = io.StringIO(), io.StringIO()
    try:
        code = run_interactive(engine, AutoregressivePolicy(engine.model, "w4a16"),
                               lambda: SamplingParams(max_new_tokens=4, ignore_eos=True), chat, system, list(first),
                               stdin=io.StringIO(text), stdout=out, stderr=err)
    finally:
        del engine.encode_chat, engine.generate
    return code, out.getvalue(), seen, err.getvalue(), calls


def test_turns_keep_the_conversation_and_reset_forgets_it(chat_engine):
    code, out, seen, err, calls = _talk(chat_engine, "hello\nmore\n/reset\nagain\n", system="be brief", first=["first"])
    assert code == 0 and len(seen) == len(calls) == 4  # one encoding and one generation per turn
    assert [s[0] for s in seen] == ["be brief"] * 4  # the system message stays through /reset
    assert seen[1][1:4:2] == ["first", "hello"] and seen[1][2] and out.startswith(seen[1][2])  # turns and replies
    assert seen[2][-1] == "more" and len(seen[2]) == 6
    assert seen[3] == ["be brief", "again"] and "forgotten" in err


def test_exit_and_raw_completion(chat_engine):
    code, out, seen, err, calls = _talk(chat_engine, "one\n/exit\ntwo\n", chat=False)
    assert code == 0 and seen == [] and "raw completion" in err
    assert calls == [chat_engine.encode_prompt("one", chat=False)]  # nothing after /exit


def test_interactive_refuses_json(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir("tiny")), "--device", "cpu", "-i", "--json"]) == 2
    assert "--json" in capsys.readouterr().err
