"""`gearshift serve`: the OpenAI-compatible endpoints over the engine thread, on a tiny random model."""

import contextlib
import gzip
import json
import threading
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from gearshift.cli import build_parser  # noqa: E402
from gearshift.cli.serve import build_server  # noqa: E402
from gearshift.decode.autoregressive import AutoregressivePolicy  # noqa: E402
from gearshift.decode.sampling import SamplingParams  # noqa: E402
from gearshift.engine.engine import Engine, Request  # noqa: E402
from gearshift.errors import GearshiftError  # noqa: E402


#: where the engine runs: the CPU always, the GPU too where there is one (CUDA graphs, Triton kernels, the
#: engine thread's own launches)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@contextlib.contextmanager
def serving(model_dir, *options, device="cpu"):
    """`gearshift serve` on the tiny model with these options: (app, worker); the engine thread is closed after."""
    args = build_parser().parse_args(["serve", "--model", str(model_dir("tiny")), "--device", device, *options])
    app, worker, _ = build_server(args)
    try:
        yield app, worker
    finally:
        worker.close(timeout=10)


@pytest.fixture(scope="module", params=DEVICES)
def server(model_dir, request):
    path = model_dir("tiny")
    args = build_parser().parse_args(["serve", "--model", str(path), "--device", request.param, "--batch-size", "3",
                                      "--max-model-len", "96", "--served-model-name", "tiny"])
    app, worker, name = build_server(args)
    with TestClient(app) as client:
        yield client, worker
    worker.close(timeout=10)


def _reference(worker, ids, n, **sampling):
    """The same request through Engine.generate alone (its own cache, batch of one)."""
    engine = Engine(worker.engine.loaded, max_batch=1, max_seq_len=96)
    (r,) = engine.generate([Request(list(ids), SamplingParams(max_new_tokens=n, ignore_eos=True, **sampling))],
                           AutoregressivePolicy(engine.model, "w4a16"))
    return r


def _post_all(client, bodies, path="/v1/completions"):
    """POST the bodies at once, one thread each (so they meet in the engine's batch); their JSON replies."""
    outs = [None] * len(bodies)

    def ask(i):
        outs[i] = client.post(path, json=bodies[i]).json()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return outs


def _sse(text):
    lines = [ln[len("data: "):] for ln in text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def test_models_and_health(server):
    client, _ = server
    assert client.get("/health").json() == {"status": "ok"}
    data = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["tiny"] and data[0]["max_model_len"] == 96


def test_greedy_completion_is_what_the_engine_generates(server):
    client, worker = server
    ids = [5, 17, 42, 7, 99]
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 12, "temperature": 0,
                                             "ignore_eos": True}).json()
    ref = _reference(worker, ids, 12)
    choice = r["choices"][0]
    assert choice["text"] == ref.text and choice["finish_reason"] == "length"
    cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]  # earlier tests' slots may share a start
    assert r["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17,
                          "prompt_tokens_details": {"cached_tokens": cached}} and 0 <= cached < 5
    assert r["object"] == "text_completion" and r["model"] == "tiny" and r["id"].startswith("cmpl-")


def test_stream_chunks_add_up_to_the_completion(server):
    client, _ = server
    body = {"prompt": "hello world", "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    with client.stream("POST", "/v1/completions", json={**body, "stream": True,
                                                        "stream_options": {"include_usage": True}}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = _sse(r.read().decode())
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == whole["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10


def test_concurrent_requests_share_the_batch_and_get_their_own_tokens(server):
    """Five requests at once through three KV slots: each one's greedy tokens are its own reference run's."""
    client, worker = server
    prompts = [[3 + i, 11 * i % 50 + 1, 8] for i in range(5)]

    widths = []
    step = worker.policy.step

    def counting_step(active, sample):  # runs on the engine thread
        widths.append(len(active))
        return step(active, sample)

    worker.policy.step = counting_step

    outs = _post_all(client, [{"prompt": prompts[i], "max_tokens": 6 + i, "temperature": 0, "ignore_eos": True}
                              for i in range(5)])
    del worker.policy.step
    assert max(widths) > 1, "the requests never decoded together"
    for i in range(5):
        assert outs[i]["choices"][0]["text"] == _reference(worker, prompts[i], 6 + i).text
        assert outs[i]["usage"]["completion_tokens"] == 6 + i


def test_a_list_of_prompts_gets_one_choice_each(server):
    client, _ = server
    r = client.post("/v1/completions", json={"prompt": [[4, 5, 6], [7, 8]], "max_tokens": 3, "temperature": 0,
                                             "ignore_eos": True}).json()
    assert [c["index"] for c in r["choices"]] == [0, 1] and r["usage"]["prompt_tokens"] == 5


def test_n_completions_per_prompt(server):
    """n: choice i * n + j is prompt i's j-th completion, sampled with seed + j (so the first is n=1's); greedy
    ones agree; usage counts each prompt once; a stream interleaves the n choices by index."""
    client, _ = server
    body = {"prompt": [[4, 5, 6], [7, 8]], "max_tokens": 8, "temperature": 1.0, "seed": 11, "ignore_eos": True}
    r = client.post("/v1/completions", json={**body, "n": 3}).json()
    assert [c["index"] for c in r["choices"]] == list(range(6))
    texts = [c["text"] for c in r["choices"]]
    assert len(set(texts[:3])) > 1 and len(set(texts[3:])) > 1
    one = client.post("/v1/completions", json=body).json()["choices"]
    assert [texts[0], texts[3]] == [c["text"] for c in one]
    assert r["usage"]["prompt_tokens"] == 5 and r["usage"]["completion_tokens"] == 6 * 8
    greedy = client.post("/v1/completions", json={**body, "temperature": 0, "n": 2}).json()["choices"]
    assert greedy[0]["text"] == greedy[1]["text"] and greedy[2]["text"] == greedy[3]["text"]
    with client.stream("POST", "/v1/completions", json={**body, "n": 2, "stream": True}) as s:
        chunks = _sse(s.read().decode())
    streamed = ["".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i) for i in range(4)]
    assert streamed == [texts[0], texts[1], texts[3], texts[4]]


def test_penalties_are_those_of_the_engine(server):
    client, worker = server
    ids = [5, 17, 42, 7]
    for pen in ({"repetition_penalty": 1.8}, {"frequency_penalty": 1.2, "presence_penalty": 0.6}):
        r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 12, "temperature": 0,
                                                 "ignore_eos": True, **pen}).json()
        assert r["choices"][0]["text"] == _reference(worker, ids, 12, **pen).text, pen
    r = client.post("/v1/completions", json={"prompt": ids, "frequency_penalty": 3})
    assert r.status_code == 400 and "frequency_penalty" in r.json()["error"]["message"]
    plain = _reference(worker, ids, 6).token_ids
    banned = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                                                  "logit_bias": {str(plain[0]): -100}}).json()["choices"][0]["text"]
    biased = _reference(worker, ids, 6, logit_bias={plain[0]: -100.0})
    assert banned == biased.text and biased.token_ids[0] != plain[0]
    for bad in ({"999999": 1}, {"x": 1}, {"3": 101}):
        r = client.post("/v1/completions", json={"prompt": ids, "logit_bias": bad})
        assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"], bad


def test_seeded_sampling_repeats(server):
    client, _ = server
    body = {"prompt": [9, 10, 11], "max_tokens": 8, "temperature": 0.9, "seed": 1234, "ignore_eos": True}
    a, b = (client.post("/v1/completions", json=body).json()["choices"][0]["text"] for _ in range(2))
    assert a == b


def test_stop_string_cuts_the_text(server):
    client, _ = server
    body = {"prompt": [5, 6, 7], "max_tokens": 20, "temperature": 0, "ignore_eos": True}
    text = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    stop = text[len(text) // 2:len(text) // 2 + 2]
    if not stop.strip():
        pytest.skip("the tiny model's greedy text has no usable stop string here")
    r = client.post("/v1/completions", json={**body, "stop": stop}).json()["choices"][0]
    assert r["finish_reason"] == "stop" and r["text"] == text[:text.index(stop)]


def test_chat_without_a_template_is_a_clear_400(server, model_dir):
    client, worker = server
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    if getattr(worker.engine.tokenizer, "chat_template", None):
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    else:
        assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]


@pytest.mark.parametrize("body, status, words", [
    ({"prompt": [1, 2], "n": 65}, 400, "n"),
    ({"prompt": [1, 2], "logprobs": 21}, 400, "logprobs"),
    ({"prompt": [1, 2], "model": "other"}, 404, "does not exist"),
    ({"prompt": [1, 2], "max_tokens": 200}, 400, "context of 96"),
    ({"prompt": [1, 2], "temperature": -1}, 400, "temperature"),
    ({"prompt": [10 ** 7]}, 400, "token ids"),
    ({"prompt": []}, 400, "empty"),
    ({"max_tokens": 3}, 400, "prompt"),
])
def test_bad_requests_get_openai_errors(server, body, status, words):
    client, _ = server
    r = client.post("/v1/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert words in err["message"] and err["type"]


def test_chat_template_conversation(model_dir, tmp_path):
    """With a chat template the conversation goes through it, and the reply is the engine's for those ids."""
    import shutil

    path = tmp_path / "chat-model"
    shutil.copytree(model_dir("tiny"), path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                            "{% if add_generation_prompt %}<assistant>{% endif %}")
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    args = build_parser().parse_args(["serve", "--model", str(path), "--device", "cpu", "--max-model-len", "200"])
    app, worker, name = build_server(args)
    try:
        with TestClient(app) as client:
            msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
            r = client.post("/v1/chat/completions", json={"messages": msgs, "max_completion_tokens": 5,
                                                          "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            out = r.json()
            ids = worker.engine.encode_chat(msgs)
            engine = Engine(worker.engine.loaded, max_batch=1, max_seq_len=200)
            (ref,) = engine.generate([Request(ids, SamplingParams(max_new_tokens=5, ignore_eos=True))],
                                     AutoregressivePolicy(engine.model, "w4a16"))
            assert out["choices"][0]["message"] == {"role": "assistant", "content": ref.text}
            assert out["usage"]["prompt_tokens"] == len(ids) and out["model"] == name == "chat-model"
            with client.stream("POST", "/v1/chat/completions",
                               json={"messages": msgs, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                                     "stream": True}) as s:
                chunks = _sse(s.read().decode())
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == ref.text
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
            r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 5, "temperature": 0,
                                                          "ignore_eos": True, "logprobs": True, "top_logprobs": 2})
            assert r.status_code == 200, r.text
            content = r.json()["choices"][0]["logprobs"]["content"]
            tok = worker.engine.tokenizer
            assert [c["token"] for c in content] == [tok.decode([t]) for t in ref.token_ids]
            assert all(c["logprob"] <= 0 and len(c["top_logprobs"]) == 2 for c in content)
            assert all(c["bytes"] == list(c["token"].encode()) for c in content)
            two = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 5, "temperature": 0,
                                                            "ignore_eos": True, "n": 2}).json()
            assert [c["message"]["content"] for c in two["choices"]] == [ref.text] * 2
            assert [c["index"] for c in two["choices"]] == [0, 1] and two["usage"]["prompt_tokens"] == len(ids)
            for bad, words in (({"top_logprobs": 2}, "needs logprobs"), ({"logprobs": True, "stream": True},
                                                                          "not streamed")):
                r = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2, **bad})
                assert r.status_code == 400 and words in r.json()["error"]["message"]
    finally:
        worker.close(timeout=10)


def test_cancelled_requests_free_their_slots(model_dir):
    """A request whose client left ends with finish reason 'abort'; the slot serves the next request."""
    import queue as queue_mod

    with serving(model_dir, "--batch-size", "1", "--max-model-len", "300") as (_, worker):
        got: queue_mod.Queue = queue_mod.Queue()
        long = worker.submit(Request([1, 2, 3], SamplingParams(max_new_tokens=250, ignore_eos=True)), got.put)
        ev = got.get(timeout=60)
        assert not ev.finished
        worker.cancel(long)
        while not ev.finished:
            ev = got.get(timeout=60)
        assert ev.finish_reason == "abort"
        short: queue_mod.Queue = queue_mod.Queue()
        worker.submit(Request([4, 5], SamplingParams(max_new_tokens=2, ignore_eos=True)), short.put)
        evs = [short.get(timeout=60)]
        while not evs[-1].finished:
            evs.append(short.get(timeout=60))
        assert evs[-1].finish_reason == "length" and sum(len(e.token_ids) for e in evs) == 2
    with pytest.raises(GearshiftError, match="not running|stopped"):
        worker.submit(Request([1], SamplingParams(max_new_tokens=1)), lambda ev: None)


def test_serve_help_and_bad_options(model_dir):
    text = build_parser().parse_args.__self__.format_help()
    assert "serve" in text
    args = build_parser().parse_args(["serve", "--model", str(model_dir("tiny")), "--device", "cpu",
                                      "--batch-size", "0"])
    with pytest.raises(GearshiftError, match="--batch-size"):
        build_server(args)
    args = build_parser().parse_args(["serve", "--model", str(model_dir("tiny")), "--device", "cpu",
                                      "--max-model-len", "100000"])
    with pytest.raises(GearshiftError, match="exceeds the model's context"):
        build_server(args)
    args = build_parser().parse_args(["serve", "--model", str(model_dir("tiny")), "--device", "cpu",
                                      "--policy", "gearbox", "--trace-out", "x.png"])
    with pytest.raises(GearshiftError, match="--trace-out"):
        build_server(args)


def test_the_command_serves_over_http_and_stops_on_ctrl_c(model_dir, tmp_path):
    """`gearshift serve` as a user runs it: a real socket, one completion, a stream whose client leaves (its slot
    is freed), SIGINT ends it with exit code 0."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "gearshift", "serve", "--model", str(model_dir("tiny")),
                             "--device", "cpu", "--port", str(port), "--max-model-len", "500", "--batch-size", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0,
                                                     "ignore_eos": True}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        # a client that leaves mid-stream: its request ends as "abort" instead of running its 480 tokens
        with httpx.stream("POST", url + "/v1/completions", timeout=60,
                          json={"prompt": [1, 2, 3], "max_tokens": 480, "temperature": 0, "ignore_eos": True,
                                "stream": True}) as s:
            next(s.iter_lines())
        for _ in range(300):
            stats = httpx.get(url + "/stats", timeout=5).json()
            if stats["requests_in_engine"] == 0:
                break
            time.sleep(0.1)
        assert stats["requests_finished"] == {"length": 1, "abort": 1}, stats
        assert stats["generated_tokens"] < 4 + 480
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert f"on http://127.0.0.1:{port}/v1" in out and "Traceback" not in out


@pytest.mark.parametrize("policy", [["--policy", "qspec", "--draft-mode", "w4a8", "--gamma", "3"],
                                    ["--policy", "gearbox", "--no-calibrate"]])
@pytest.mark.parametrize("device", DEVICES)
def test_other_policies_serve_concurrent_requests(model_dir, policy, device):
    """QSPEC (greedy: exactly W4A16's tokens) and GEARBX behind the server, requests arriving together."""
    with serving(model_dir, "--batch-size", "2", "--max-model-len", "96", *policy, device=device) as (app, worker):
        with TestClient(app) as client:
            prompts = [[3, 4, 5], [9, 8, 7, 6], [20, 21]]
            outs = _post_all(client, [{"prompt": p, "max_tokens": 9, "temperature": 0, "ignore_eos": True}
                                      for p in prompts])
            for i in range(3):
                assert outs[i]["usage"]["completion_tokens"] == 9
                if policy[1] == "qspec":
                    assert outs[i]["choices"][0]["text"] == _reference(worker, prompts[i], 9).text
            assert getattr(worker.policy, "sequences", []) == []  # nothing kept per finished request
            r = client.post("/v1/completions", json={"prompt": prompts[0], "max_tokens": 4, "repetition_penalty": 1.2})
            assert r.status_code == 400 and "need the ar policy" in r.json()["error"]["message"]
            r = client.post("/v1/completions", json={"prompt": prompts[0], "max_tokens": 4, "temperature": 0,
                                                     "ignore_eos": True, "logprobs": 1}).json()["choices"][0]
            assert r["text"] == outs[0]["choices"][0]["text"][:len(r["text"])]  # generated as without logprobs
            assert len(r["logprobs"]["token_logprobs"]) == 4 and all(v <= 0 for v in r["logprobs"]["token_logprobs"])


def _serve_one(worker, ids, n, mode=None):
    """One request straight to the engine thread: its tokens and how many prompt tokens it reused."""
    import queue as queue_mod

    got: queue_mod.Queue = queue_mod.Queue()
    worker.submit(Request(list(ids), SamplingParams(max_new_tokens=n, ignore_eos=True), mode=mode), got.put)
    evs = [got.get(timeout=60)]
    while not evs[-1].finished:
        evs.append(got.get(timeout=60))
    return [t for e in evs for t in e.token_ids], evs[-1].cached_tokens


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("device", DEVICES)
def test_prefix_reuse_prefills_only_the_new_tokens_and_gives_the_same_tokens(model_dir, reuse, device):
    """A second turn that resends the first one (prompt + reply + more) starts from the slot's K/V: it reports
    those tokens as cached and decodes what a fresh prefill decodes. A prompt that diverges reuses up to it."""
    with serving(model_dir, "--batch-size", "2",
                 "--max-model-len", "128", *([] if reuse else ["--no-prefix-reuse"]), device=device) as (_, worker):
        prefilled = []
        rows_of = worker.policy.prefill_rows

        def counting(rows, mode, logits):  # on the engine thread
            prefilled.append(sum(map(len, rows.values())))
            return rows_of(rows, mode, logits)

        worker.policy.prefill_rows = counting
        first = [7, 3, 9, 1, 44, 12]
        reply, cached = _serve_one(worker, first, 10)
        assert cached == 0
        second = first + reply + [5, 6, 7]
        out, cached = _serve_one(worker, second, 8)
        held = len(first) + len(reply) - 1  # the last reply token was never fed, so its K/V was not written
        assert cached == (held if reuse else 0)
        assert prefilled == [len(first) - 1, len(second) - 1 - cached]
        assert out == _reference(worker, second, 8).token_ids
        other = first[:3] + [100, 101]
        out, cached = _serve_one(worker, other, 5)
        assert cached == (3 if reuse else 0)
        assert out == _reference(worker, other, 5).token_ids
        assert worker.stats()["prompt_tokens_reused"] == (held + 3 if reuse else 0)


def test_policies_that_mix_modes_do_not_reuse_prefixes(model_dir):
    with serving(model_dir, "--max-model-len", "96", "--policy", "qspec", "--draft-mode", "w4a8") as (_, worker):
        reply, _ = _serve_one(worker, [1, 2, 3, 4], 6)
        _, cached = _serve_one(worker, [1, 2, 3, 4] + reply + [9], 4)
        assert cached == 0 and worker.stats()["prefix_reuse"] is False


@pytest.mark.parametrize("device", DEVICES)
def test_each_request_runs_the_mode_its_model_id_names(model_dir, device):
    """--modes: NAME:MODE model ids; requests of three modes decode in one batch, and each one's greedy tokens are
    those of a single-mode run of its mode (the rows of the other modes' forwards are left alone)."""
    with serving(model_dir, "--batch-size", "3", "--max-model-len", "96", "--served-model-name", "tiny",
                 "--modes", "w4a8,w4a4", device=device) as (app, worker):
        mixed = []
        step = worker.policy.step

        def recording(seqs, sample):  # on the engine thread
            mixed.append(len({s.mode for s in seqs}))
            return step(seqs, sample)

        worker.policy.step = recording
        with TestClient(app) as client:
            ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
            assert ids == ["tiny", "tiny:w4a16", "tiny:w4a8", "tiny:w4a4"]
            asks = [("tiny", "w4a16", [3, 4, 5]), ("tiny:w4a8", "w4a8", [3, 4, 5]), ("tiny:w4a4", "w4a4", [9, 8, 7])]
            outs = _post_all(client, [{"model": name, "prompt": prompt, "max_tokens": 10, "temperature": 0,
                                       "ignore_eos": True} for name, _, prompt in asks])
            for (name, mode, prompt), out in zip(asks, outs, strict=True):
                engine = Engine(worker.engine.loaded, max_batch=1, max_seq_len=96)
                (ref,) = engine.generate([Request(prompt, SamplingParams(max_new_tokens=10, ignore_eos=True))],
                                         AutoregressivePolicy(engine.model, mode))
                assert out["model"] == name and out["choices"][0]["text"] == ref.text, mode
            assert max(mixed) > 1, "the modes never decoded in one batch"
            counts = worker.policy.stats()
            assert all(counts[f"forwards_{m}"] > 0 for m in ("w4a16", "w4a8", "w4a4")), counts
            r = client.post("/v1/completions", json={"model": "tiny:w8a8", "prompt": [1, 2]})
            assert r.status_code == 404 and "tiny:w4a8" in r.json()["error"]["message"]
            assert client.get("/stats").json()["modes"] == ["w4a16", "w4a8", "w4a4"]


def test_prefix_reuse_keeps_to_the_mode(model_dir):
    """A slot holding w4a8 K/V is not reused by a w4a16 request with the same prompt, and is by a w4a8 one."""
    with serving(model_dir, "--batch-size", "2", "--max-model-len", "96", "--modes", "w4a8") as (_, worker):
        prompt = [5, 6, 7, 8, 9, 10]
        assert _serve_one(worker, prompt, 3, "w4a8")[1] == 0
        assert _serve_one(worker, prompt, 3, "w4a16")[1] == 0  # the other mode: no reuse (it takes the empty slot)
        assert _serve_one(worker, prompt, 3, "w4a8")[1] == len(prompt) - 1


def test_modes_need_the_ar_policy(model_dir):
    args = build_parser().parse_args(["serve", "--model", str(model_dir("tiny")), "--device", "cpu",
                                      "--policy", "qspec", "--modes", "w4a8"])
    with pytest.raises(GearshiftError, match="--modes needs --policy ar"):
        build_server(args)


def test_score_prompt_is_what_decoding_token_by_token_gives(server):
    """Each prompt token's logprob from the one scoring forward equals the logprob of that token after the
    prefix before it (a forward per prefix), and the greedy next token is generation's first token."""
    from gearshift.engine.scoring import score_prompt

    _, worker = server
    model = worker.engine.model
    ids = [11, 5, 42, 7, 99, 3]
    got = score_prompt(model, ids, "w4a16", top=3)
    assert got.token_logprobs[0] is None and got.top_logprobs[0] is None
    for p in range(1, len(ids)):
        cache = model.new_cache(1, p + 1)
        logits = model(torch.tensor([ids[:p]], device=model.device), cache, [0], [p], mode="w4a16", logits="last")[0, 0]
        lp = torch.log_softmax(logits.float(), -1)
        # fp32 on the CPU; bf16 on the GPU, where the prompt-long forward and the prefix forwards run other tiles
        assert abs(got.token_logprobs[p] - float(lp[ids[p]])) < (1e-4 if model.dtype == torch.float32 else 3e-2)
        assert [t for t, _ in got.top_logprobs[p]] == lp.topk(3).indices.tolist()
    assert got.next_token == _reference(worker, ids, 1).token_ids[0]


def test_echo_and_logprobs_score_a_prompt_as_evaluation_harnesses_ask(server):
    client, worker = server
    ids = [11, 5, 42, 7, 99, 3]
    r = client.post("/v1/completions", json={"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 1,
                                             "temperature": 0})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids) + 1
    assert lp["token_logprobs"][0] is None and all(v <= 0 for v in lp["token_logprobs"][1:])
    assert all(1 <= len(row) <= 2 for row in lp["top_logprobs"][1:])
    nxt = _reference(worker, ids, 1).token_ids[0]
    tok = worker.engine.tokenizer
    assert lp["tokens"][-1] == tok.decode([nxt]) and r.json()["choices"][0]["text"].endswith(tok.decode([nxt]))
    assert lp["text_offset"][1] == len(lp["tokens"][0])
    r0 = client.post("/v1/completions", json={"prompt": ids, "echo": True, "logprobs": 0, "max_tokens": 0}).json()
    assert r0["choices"][0]["logprobs"]["token_logprobs"] == lp["token_logprobs"][:-1]
    assert r0["usage"]["completion_tokens"] == 0 and client.get("/stats").json()["prompts_scored"] >= 2


def test_logprobs_of_generated_text_are_those_of_scoring_prompt_and_completion(server):
    """logprobs with a completion: the tokens generated as without them, each with its logprob given the prompt
    and the tokens before it (one scoring forward of prompt + completion); greedy tokens are their position's
    likeliest. Sampled text and echo get them too."""
    from gearshift.engine.scoring import score_prompt

    client, worker = server
    ids = [11, 5, 42, 7]
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                                             "logprobs": 3}).json()
    ref = _reference(worker, ids, 6)
    choice, tok = r["choices"][0], worker.engine.tokenizer
    lp = choice["logprobs"]
    assert choice["text"] == ref.text and lp["tokens"] == [tok.decode([t]) for t in ref.token_ids]
    alone = score_prompt(worker.engine.model, ids + ref.token_ids, "w4a16", top=3)
    assert lp["token_logprobs"] == pytest.approx(alone.token_logprobs[len(ids):], abs=1e-5)
    assert all(len(row) == 3 and max(row, key=row.get) == t for row, t in zip(lp["top_logprobs"], lp["tokens"]))
    assert lp["text_offset"][0] == 0 and r["usage"]["completion_tokens"] == 6
    sampled = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 5, "temperature": 0.9, "seed": 3,
                                                   "ignore_eos": True, "logprobs": 0}).json()["choices"][0]
    plain = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 5, "temperature": 0.9, "seed": 3,
                                                 "ignore_eos": True}).json()["choices"][0]
    assert sampled["text"] == plain["text"] and len(sampled["logprobs"]["token_logprobs"]) == 5
    assert all(v <= 0 for v in sampled["logprobs"]["token_logprobs"])
    echoed = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 2, "temperature": 0, "echo": True,
                                                  "ignore_eos": True, "logprobs": 1}).json()["choices"][0]
    assert len(echoed["logprobs"]["tokens"]) == len(ids) + 2 and echoed["logprobs"]["token_logprobs"][0] is None
    assert echoed["text"] == "".join(tok.decode([t]) for t in ids) + _reference(worker, ids, 2).text
    two = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 3, "temperature": 0.9, "seed": 5, "n": 2,
                                               "ignore_eos": True, "logprobs": 0}).json()["choices"]
    assert [c["index"] for c in two] == [0, 1] and all(len(c["logprobs"]["tokens"]) == 3 for c in two)


@pytest.mark.parametrize("body, words", [
    ({"echo": True, "stream": True, "max_tokens": 0}, "not streamed"),
    ({"logprobs": 1, "stream": True, "max_tokens": 3}, "not streamed"),
    ({"max_tokens": 0}, "needs echo"),
])
def test_scoring_requests_it_cannot_answer(server, body, words):
    client, _ = server
    r = client.post("/v1/completions", json={"prompt": [1, 2, 3], **body})
    assert r.status_code == 400 and words in r.json()["error"]["message"]


@pytest.mark.parametrize("device", DEVICES)
def test_scoring_runs_between_the_steps_of_a_running_batch(model_dir, device):
    """A scoring job queued while a generation decodes runs on the engine thread between two of its steps; the
    generation's tokens stay its reference's, and the scores are those of a standalone scoring."""
    import queue as queue_mod

    from gearshift.engine.scoring import score_prompt

    with serving(model_dir, "--batch-size", "1", "--max-model-len", "128", device=device) as (_, worker):
        events: queue_mod.Queue = queue_mod.Queue()
        worker.submit(Request([4, 8, 15], SamplingParams(max_new_tokens=60, ignore_eos=True)), events.put)
        first = events.get(timeout=60)
        scored: queue_mod.Queue = queue_mod.Queue()
        worker.score([16, 23, 42, 5], None, 2, scored.put)
        got = scored.get(timeout=60)
        evs = [first]
        while not evs[-1].finished:
            evs.append(events.get(timeout=60))
        assert not first.finished and sum(len(e.token_ids) for e in evs) == 60
        assert [t for e in evs for t in e.token_ids] == _reference(worker, [4, 8, 15], 60).token_ids
        alone = score_prompt(worker.engine.model, [16, 23, 42, 5], "w4a16", top=2)
        assert got.token_logprobs[1:] == pytest.approx(alone.token_logprobs[1:], abs=1e-5)
        assert got.next_token == alone.next_token


def test_load_benchmark_runs_against_a_started_server(model_dir, tmp_path):
    """benchmarks/serve_load.py starts `gearshift serve`, keeps N streamed requests in flight per level and
    writes what each level measured; every request got its tokens. --sample-stacks leaves the server's
    sampled stacks, engine thread included, which benchmarks/stall_report.py reads."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_scripts import load_script

    mod = load_script("serve_load.py")
    assert mod.main(["--model", str(model_dir("tiny")), "--concurrency", "1,3", "--requests", "3", "--gen-len", "5",
                     "--prompt-words", "12", "--warmup", "1", "--out", str(tmp_path), "--sample-stacks",
                     "--sampling", '{"temperature": 0.8, "top_p": 0.9}', "--",
                     "--device", "cpu", "--batch-size", "2", "--max-model-len", "128"]) == 0
    (out,) = tmp_path.glob("serve_load_*.json")
    d = json.loads(out.read_text())
    assert d["device"] == "cpu" and d["server"]["batch_size"] == 2 and d["startup_s"] > 0
    assert d["sampling"] == {"temperature": 0.8, "top_p": 0.9}
    assert "gearshift serve: " in (tmp_path / "serve_load_server.log").read_text()  # the server's own output
    assert [lv["concurrency"] for lv in d["levels"]] == [1, 3]
    for lv in d["levels"]:
        assert [r["completion_tokens"] for r in lv["per_request"]] == [5] * 3
        assert 0 < lv["ttft_median_ms"] <= lv["latency_median_ms"] and lv["output_tokens_per_s"] > 0
        assert 0 < lv["text_chunks_per_token"] <= 1  # (streamed text per generated token: see the script)
    (dump,) = (tmp_path / "stacks").glob("stacks_*.json.gz")
    report = load_script("stall_report.py")
    with gzip.open(dump, "rt") as f:
        d = json.load(f)
    runs = report.stretches(d["samples"], d["stacks"], "gearshift-engine", 3)
    assert runs and all(r["seconds"] >= 0 and r["stack"] for r in runs)


def test_api_key_guards_the_v1_endpoints(model_dir, monkeypatch):
    """--api-key (or $GEARSHIFT_API_KEY): /v1 answers 401 without 'Authorization: Bearer KEY'; /health stays open."""
    monkeypatch.setenv("GEARSHIFT_API_KEY", "s3cret")
    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "serve" in a.choices)
    assert "s3cret" not in sub.choices["serve"].format_help()  # a secret never shows as a default
    with serving(model_dir, "--max-model-len", "64") as (app, _):
        with TestClient(app) as client:
            assert client.get("/health").status_code == 200
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                r = client.get("/v1/models", headers=headers)
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            ok = client.post("/v1/completions", headers={"Authorization": "Bearer s3cret"},
                             json={"prompt": [1, 2], "max_tokens": 2, "ignore_eos": True})
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_a_non_streamed_request_whose_client_left_is_aborted(model_dir):
    """A non-streamed completion's client that disconnects (`gone`, asked every half second while tokens keep
    coming, says so) ends its request: finish reason 'abort', the slot freed for the next request."""
    import asyncio
    import time

    from gearshift.serve.openai_api import APIError, _collect

    with serving(model_dir, "--batch-size", "1", "--max-model-len", "500") as (_, worker):
        step = worker.policy.step

        def slow_step(active, sample):  # on the engine thread: a long request, slowly
            time.sleep(0.05)
            return step(active, sample)

        worker.policy.step = slow_step
        asked = []

        async def gone():
            asked.append(time.monotonic())
            return len(asked) >= 2

        async def main():
            events = _collect(worker, [Request([1, 2, 3], SamplingParams(max_new_tokens=480, ignore_eos=True))], gone)
            with pytest.raises(APIError) as e:
                await events
            return e.value.status

        assert asyncio.run(main()) == 499
        del worker.policy.step
        for _ in range(200):
            if worker.stats()["requests_finished"].get("abort"):
                break
            time.sleep(0.05)
        assert worker.stats()["requests_finished"] == {"abort": 1} and worker.stats()["generated_tokens"] < 100
        assert _serve_one(worker, [4, 5], 3)[0] and worker.stats()["requests_finished"]["length"] == 1


def test_metrics_are_the_stats_for_prometheus(server):
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    client, worker = server
    client.post("/v1/completions", json={"prompt": [3, 4], "max_tokens": 3, "temperature": 0, "ignore_eos": True})
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(r.text) for s in fam.samples}
    stats = worker.stats()
    assert samples[("gearshift_generated_tokens_total", ())] == stats["generated_tokens"] >= 3
    finished = samples[("gearshift_requests_finished_total", (("reason", "length"),))]
    assert finished == stats["requests_finished"]["length"]
    assert samples[("gearshift_kv_slots", ())] == 3 and samples[("gearshift_up", ())] == 1
    info = next(k for k in samples if k[0] == "gearshift_server_info")
    assert ("policy", "ar") in info[1]
    ttft, latency = stats["time_to_first_token"], stats["request_latency"]
    assert ttft["count"] >= 1 and latency["count"] >= 1 and ttft["mean_s"] > 0 and latency["mean_s"] > 0
    assert samples[("gearshift_time_to_first_token_seconds_count", ())] == ttft["count"]
    assert samples[("gearshift_request_latency_seconds_bucket", (("le", "+Inf"),))] == latency["count"]
    assert samples[("gearshift_request_latency_seconds_sum", ())] == pytest.approx(latency["sum_s"])


def test_a_taken_port_is_refused_before_the_model_loads(capsys):
    import socket

    from gearshift.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--model", "/nonexistent/model", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "nonexistent" not in err


def test_alternatives_of_rows_without_any_are_empty_whatever_batch_decode_says():
    """logprobs=0 asks for no alternatives: no token's text is looked up (transformers 5's TokenizersBackend
    answers batch_decode([]) with [''], which made the strict zip fail on the GPU machine)."""
    from gearshift.serve.openai_api import _alternatives

    class Tok:
        def batch_decode(self, seqs):
            return [f"t{s[0]}" for s in seqs] if seqs else [""]

    assert _alternatives(Tok(), [None, [], []]) == {}
    assert _alternatives(Tok(), [None, [(5, -0.1), (7, -2.0)], [(5, -0.3)]]) == {5: "t5", 7: "t7"}


def test_stats_count_kernel_compiles_while_serving(model_dir):
    """A server on a GPU watches Triton compiles after its warm-up (`kernels.compile_watch`); /stats counts them."""
    from gearshift.kernels.compile_watch import CompileEvent, CompileWatch

    with serving(model_dir, "--max-model-len", "64") as (app, worker):
        if worker.compile_watch is None:  # (the CPU: nothing compiles)
            assert "kernel_compiles_while_serving" not in worker.stats()
            worker.compile_watch = CompileWatch()
        worker.compile_watch.events.append(CompileEvent("k", "k()", 1.25))
        with TestClient(app) as client:
            stats = client.get("/stats").json()
        assert stats["kernel_compiles_while_serving"] >= 1 and stats["kernel_compile_seconds_while_serving"] >= 1.25


@pytest.mark.parametrize("device", DEVICES)
def test_stats_count_cuda_graph_captures_while_serving(model_dir, device):
    """On a GPU /stats (and /metrics) count the CUDA graphs captured after the start (each one stalls the running
    batch): without a warm-up a first request captures some. A model that captures none reports nothing."""
    with serving(model_dir, "--max-model-len", "64", "--no-warmup", device=device) as (app, worker):
        with TestClient(app) as client:
            client.post("/v1/completions", json={"prompt": [3, 4, 5], "max_tokens": 3, "temperature": 0,
                                                 "ignore_eos": True})
            stats = client.get("/stats").json()
            metrics = client.get("/metrics").text
    if device == "cpu":
        assert "cuda_graph_captures_while_serving" not in stats
        assert "gearshift_cuda_graph_captures_while_serving" not in metrics
    else:
        assert stats["cuda_graph_captures_while_serving"] >= 1
        assert stats["cuda_graph_capture_seconds_while_serving"] > 0
        assert "gearshift_cuda_graph_captures_while_serving_total" in metrics
        shapes = stats["cuda_graph_shapes_while_serving"]
        assert len(shapes) == min(stats["cuda_graph_captures_while_serving"], 64)
        assert all(g["rows"] >= 1 and g["tokens"] >= 1 and g["seconds"] > 0 for g in shapes)


def test_stats_name_the_graph_shapes_captured_while_serving(model_dir, monkeypatch):
    """/stats lists the shapes of the captures since the start (the warm-up's are not), from the runner's
    record of its latest captures: what a warm-up missed, without a profiler."""
    from collections import deque
    from types import SimpleNamespace

    with serving(model_dir, "--max-model-len", "64") as (app, worker):
        shape = {"rows": 4, "tokens": 1, "context": 128, "mode": "w4a16", "logits": "last", "seconds": 0.1}
        runner = SimpleNamespace(captures=5, capture_s=0.9,
                                 recent=deque([dict(shape, rows=r) for r in (1, 2, 4, 8, 16)], maxlen=64))
        monkeypatch.setattr(worker.engine.model, "_graph_runner", lambda: runner)
        monkeypatch.setattr(worker, "_graph_captures", lambda: (runner.captures, runner.capture_s))
        worker._graphs_at_start = (3, 0.5)  # the warm-up captured the first three
        with TestClient(app) as client:
            stats = client.get("/stats").json()
            client.get("/metrics").raise_for_status()
    assert stats["cuda_graph_captures_while_serving"] == 2
    assert [g["rows"] for g in stats["cuda_graph_shapes_while_serving"]] == [8, 16]
