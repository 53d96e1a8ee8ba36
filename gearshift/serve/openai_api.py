"""The OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions (both with SSE streaming),
/v1/models, /health, /stats (requests held and finished, by reason) and /metrics (the same for Prometheus),
over one `EngineWorker`.

Every request joins the engine's running batch; errors come back as OpenAI error objects
({"error": {"message", "type", "param", "code"}}) with a 4xx status, never as a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
import uuid
from typing import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from gearshift.engine.engine import Request, StreamEvent
from gearshift.errors import GearshiftError
from gearshift.serve.schemas import ChatCompletionRequest, CompletionRequest, _Sampling
from gearshift.serve.worker import EngineWorker


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


def create_app(worker: EngineWorker, model_name: str, api_key: str | None = None) -> FastAPI:
    # the handlers tokenize with a copy of their own: an HF fast tokenizer used from two threads at once (here
    # and the engine thread's detokenizer) can fail with "Already borrowed"
    engine = copy.copy(worker.engine)
    engine.tokenizer = copy.deepcopy(worker.engine.tokenizer)
    app = FastAPI(title="gearshift", description="OpenAI-compatible API over the gearshift engine")
    served = worker.policy.modes
    # model id -> the precision mode it asks for (None: the policy's own); NAME:MODE ids where a policy serves several
    model_ids = {model_name: None, **({f"{model_name}:{m}": m for m in served} if len(served) > 1 else {})}

    @app.exception_handler(APIError)
    async def _api_error(_, e: APIError):
        return e.response()

    if api_key:
        import hmac

        @app.middleware("http")
        async def _authorized(request, call_next):
            if request.url.path.startswith("/v1"):
                given = request.headers.get("authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                    return APIError(401, "a valid API key is needed: send 'Authorization: Bearer KEY'",
                                    code="invalid_api_key").response()
            return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        if first.get("type") == "json_invalid":
            return APIError(400, f"the request body is not valid JSON ({first.get('ctx', {}).get('error', '')})"
                            .replace(" ()", "")).response()
        where = ".".join(str(x) for x in first.get("loc", ())[1:])
        return APIError(400, f"{where}: {first.get('msg', 'invalid request')}" if where else
                        first.get("msg", "invalid request"), param=where or None).response()

    @app.get("/health")
    async def health():
        if not worker.alive:
            raise APIError(503, f"the engine has stopped: {worker.error!r}", "server_error")
        return {"status": "ok"}

    @app.get("/stats")
    async def stats():
        return worker.stats()

    @app.get("/metrics")
    async def metrics():
        """/stats in Prometheus' text format, for a scraper."""
        try:
            from prometheus_client import generate_latest
        except ModuleNotFoundError:
            raise APIError(404, "/metrics needs prometheus-client: pip install 'gearshift[serve]'") from None
        from fastapi.responses import Response

        from gearshift.serve.metrics import registry_for

        return Response(generate_latest(registry_for(worker)), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        now = int(time.time())
        return {"object": "list", "data": [{"id": name, "object": "model", "created": now, "owned_by": "gearshift",
                                            "max_model_len": engine.max_seq_len,
                                            "mode": mode or worker.policy.mode}
                                           for name, mode in model_ids.items()]}

    def check(body: _Sampling) -> str | None:
        """The precision mode the request's model id asks for (None: the policy's own)."""
        if body.model is not None and body.model not in model_ids:
            raise APIError(404, f"the model {body.model!r} does not exist; this server serves "
                                f"{', '.join(map(repr, model_ids))}", param="model", code="model_not_found")
        why = body.unsupported()
        if why:
            raise APIError(400, why)
        return model_ids.get(body.model) if body.model is not None else None

    def make_request(ids: list[int], body: _Sampling, max_tokens: int | None, mode: str | None,
                     copy: int = 0) -> Request:
        if not ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        vocab = engine.loaded.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise APIError(400, f"prompt token ids must be in 0..{vocab - 1}", param="prompt")
        n = max_tokens if max_tokens is not None else engine.max_seq_len - len(ids)
        try:
            if n < 1:
                raise GearshiftError(f"the prompt's {len(ids)} tokens fill the context of {engine.max_seq_len}")
            engine.check_fits(ids, n)
            r = Request(ids, body.sampling(n, copy), mode=mode)
            if r.params.logit_bias and max(r.params.logit_bias) >= vocab:
                raise GearshiftError(f"logit_bias token ids must be in 0..{vocab - 1}")
            engine.check_request(r, worker.policy)  # what the policy cannot run as asked is a 400, not a dead loop
            return r
        except GearshiftError as e:
            raise APIError(400, str(e)) from None

    def encode(text: str) -> list[int]:
        if engine.tokenizer is None:
            raise APIError(400, "this model has no tokenizer: send the prompt as token ids", param="prompt")
        return engine.encode_prompt(text, chat=False)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: HTTPRequest):
        mode = check(body)
        p = body.prompt
        prompts = [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)
        if not prompts:
            raise APIError(400, "the prompt list is empty", param="prompt")
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": body.model or model_name}
        ids_of = [x if isinstance(x, list) else encode(x) for x in prompts]
        if body.echo or body.logprobs is not None:
            return await scored(body, prompts, ids_of, mode, head, http.is_disconnected)
        if body.max_tokens == 0:
            raise APIError(400, "max_tokens 0 needs echo (scoring the prompt)", param="max_tokens")
        reqs = [make_request(ids, body, body.max_tokens, mode, j) for ids in ids_of for j in range(body.n)]
        if body.stream:
            def chunk(i, ev: StreamEvent):
                return {**head, "choices": [{"index": i, "text": ev.text, "logprobs": None,
                                             "finish_reason": ev.finish_reason if ev.finished else None}]}
            return _sse(_events(worker, reqs), chunk, reqs, head, _include_usage(body), body.n)
        outs = await _collect(worker, reqs, http.is_disconnected)
        return {**head, "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": reason}
                                    for i, (text, _, reason, _) in enumerate(outs)],
                "usage": _usage(reqs, outs, body.n)}

    async def scores_of(ids: list[int], mode: str | None, top: int):
        """PromptScores of `ids` from one forward in `mode` on the engine thread, between the batch's steps."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def sink(out):
            with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody is listening
                loop.call_soon_threadsafe(done.set_result, out)
        try:
            worker.score(ids, mode, top, sink)
        except GearshiftError as e:
            raise APIError(503, str(e), "server_error") from None
        out = await done
        if isinstance(out, BaseException):
            raise APIError(500, f"scoring failed: {out}", "server_error")
        return out

    async def scored(body: CompletionRequest, prompts: list, ids_of: list[list[int]], mode: str | None, head: dict,
                     gone):
        """echo / logprobs. max_tokens 0 scores the prompt (evaluation harnesses' loglikelihood); otherwise the
        completions are generated as any other, then prompt + completion are scored by one forward each in the
        request's mode, which gives the logprobs (the raw distribution, before temperature or top-k / top-p)."""
        if body.stream:
            raise APIError(400, "echo and logprobs are not streamed: send stream=false", param="stream")
        tok = engine.tokenizer
        prompts = [x for x in prompts for _ in range(body.n)]  # choice i * n + j: prompt i's j-th completion
        ids_of = [ids for ids in ids_of for _ in range(body.n)]
        n = body.max_tokens
        reqs = [make_request(ids, body, max(n, 1) if n is not None else None, mode, i % body.n)
                for i, ids in enumerate(ids_of)]
        outs = await _collect(worker, reqs, gone) if n != 0 else [("", [], "length", 0)] * len(reqs)
        choices, scores = [], {}  # (one forward per distinct sequence: n greedy copies, or n echoes, share it)
        for i, (x, ids, (text, out_ids, reason, _)) in enumerate(zip(prompts, ids_of, outs, strict=True)):
            sc = None
            if body.logprobs is not None:
                key = tuple(ids + out_ids)
                if key not in scores:
                    scores[key] = await scores_of(ids + out_ids, mode, body.logprobs)
                sc = scores[key]
            first = 0 if body.echo else len(ids)  # the positions that come back
            kept = (ids + out_ids)[first:]
            pieces = _pieces(tok, kept)
            if body.echo:
                text = (x if isinstance(x, str) else "".join(pieces[:len(ids)])) + text
            logprobs = None
            if sc is not None:
                offsets = [0]
                for piece in pieces[:-1]:
                    offsets.append(offsets[-1] + len(piece))
                tops = sc.top_logprobs[first:]
                names = _alternatives(tok, tops)
                logprobs = {"tokens": pieces, "token_logprobs": sc.token_logprobs[first:], "text_offset": offsets,
                            "top_logprobs": [None if row is None else {names[t]: v for t, v in row} for row in tops]}
            choices.append({"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason})
        return {**head, "choices": choices, "usage": _usage(reqs, outs, body.n)}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, http: HTTPRequest):
        mode = check(body)
        if engine.tokenizer is None or not getattr(engine.tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template: use /v1/completions")
        if any(m.has_non_text() for m in body.messages):
            raise APIError(400, "only text message content is supported", param="messages")
        msgs = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
        try:
            ids = engine.encode_chat(msgs)
        except Exception as e:  # a template that rejects the conversation (e.g. roles out of order)
            raise APIError(400, f"the chat template rejected the messages: {e}", param="messages") from None
        limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        reqs = [make_request(ids, body, limit, mode, j) for j in range(body.n)]
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": body.model or model_name}
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if body.stream and body.logprobs:
            raise APIError(400, "logprobs are not streamed: send stream=false", param="stream")
        if body.stream:
            started = set()

            def chunk(i, ev: StreamEvent):
                delta = {"content": ev.text}
                if i not in started:
                    started.add(i)
                    delta = {"role": "assistant", **delta}
                return {**head, "object": "chat.completion.chunk",
                        "choices": [{"index": i, "delta": delta, "logprobs": None,
                                     "finish_reason": ev.finish_reason if ev.finished else None}]}
            return _sse(_events(worker, reqs), chunk, reqs, {**head, "object": "chat.completion.chunk"},
                        _include_usage(body), body.n)
        outs = await _collect(worker, reqs, http.is_disconnected)
        logprobs = [None] * len(outs)
        if body.logprobs:  # as for completions: prompt + reply scored by one forward in the request's mode
            for i, (_, out_ids, _, _) in enumerate(outs):
                sc = await scores_of(ids + out_ids, mode, body.top_logprobs or 0)
                tops = sc.top_logprobs[len(ids):]
                names = _alternatives(engine.tokenizer, tops)
                logprobs[i] = {"content": [{**_chat_logprob(piece, lp),
                                            "top_logprobs": [_chat_logprob(names[t], v) for t, v in row]}
                                           for piece, lp, row in zip(_pieces(engine.tokenizer, out_ids),
                                                                     sc.token_logprobs[len(ids):], tops, strict=True)],
                               "refusal": None}
        return {**head, "choices": [{"index": i, "message": {"role": "assistant", "content": text},
                                     "logprobs": logprobs[i], "finish_reason": reason}
                                    for i, (text, _, reason, _) in enumerate(outs)],
                "usage": _usage(reqs, outs, body.n)}

    return app


async def _events(worker: EngineWorker, reqs: list[Request],
                  gone: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[tuple[int, StreamEvent]]:
    """Submit the requests and yield (which, event) as the engine thread produces them; a consumer that
    stops early (a stream's client went away) cancels what is still running, and so does `gone` (asked every
    half second) saying the client left (a non-streamed request's client timing out)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()

    def sink_for(i):
        def sink(ev):
            with contextlib.suppress(RuntimeError):  # the event loop has closed (shutdown): nobody is listening
                loop.call_soon_threadsafe(q.put_nowait, (i, ev))
        return sink

    try:
        rids = [worker.submit(r, sink_for(i)) for i, r in enumerate(reqs)]
    except GearshiftError as e:
        raise APIError(503, str(e), "server_error") from None
    left = set(range(len(reqs)))
    try:
        check_at = loop.time() + 0.5
        while left:
            if gone is None:
                i, ev = await q.get()
            else:  # asked every half second, whether or not tokens keep arriving
                try:
                    i, ev = await asyncio.wait_for(q.get(), max(0.0, check_at - loop.time()))
                except asyncio.TimeoutError:
                    i = None
                if loop.time() >= check_at:
                    if await gone():
                        raise APIError(499, "the client closed the request")
                    check_at = loop.time() + 0.5
                if i is None:
                    continue
            if isinstance(ev, BaseException):
                raise APIError(503, f"the engine has stopped: {ev}", "server_error")
            if ev.finished:
                left.discard(i)
            yield i, ev
    finally:
        for i in left:
            worker.cancel(rids[i])


def _pieces(tok, ids: list[int]) -> list[str]:
    """Each token's own text (a byte-level token that ends mid-character decodes to U+FFFD, as elsewhere)."""
    if not ids:  # (some tokenizers' batch_decode([]) answers [''])
        return []
    return tok.batch_decode([[t] for t in ids]) if tok is not None else [str(t) for t in ids]


def _alternatives(tok, tops: list) -> dict[int, str]:
    """The text of every token id among the rows of top alternatives (rows may be None or empty)."""
    alts = list(dict.fromkeys(t for row in tops if row for t, _ in row))
    return dict(zip(alts, _pieces(tok, alts), strict=True))


def _chat_logprob(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


async def _collect(worker: EngineWorker, reqs: list[Request],
                   gone: Callable[[], Awaitable[bool]] | None = None) -> list[tuple[str, list[int], str, int]]:
    """(text, token ids, finish reason, prompt tokens reused) per request, once all have finished; `gone`: see
    `_events`."""
    ids: list[list[int]] = [[] for _ in reqs]
    texts: list[list[str]] = [[] for _ in reqs]
    outs: list = [None] * len(reqs)
    async for i, ev in _events(worker, reqs, gone):
        ids[i] += ev.token_ids
        texts[i].append(ev.text)
        if ev.finished:
            text = ev.full_text if ev.full_text is not None else "".join(texts[i])
            outs[i] = (text, ids[i], ev.finish_reason or "length", ev.cached_tokens)
    return outs


def _usage_of(prompt: int, completion: int, cached: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _usage(reqs: list[Request], outs, n: int = 1) -> dict:
    """n: completions per prompt, whose prompt counts once (as OpenAI's usage does)."""
    return _usage_of(sum(len(r.prompt_ids) for r in reqs) // n, sum(len(o[1]) for o in outs),
                     sum(o[3] for o in outs))


def _include_usage(body: _Sampling) -> bool:
    opts = (body.model_extra or {}).get("stream_options") or {}
    return bool(isinstance(opts, dict) and opts.get("include_usage"))


def _sse(events: AsyncIterator[tuple[int, StreamEvent]], chunk, reqs: list[Request], head: dict,
         include_usage: bool, n: int = 1) -> StreamingResponse:
    async def body():
        counts = [0] * len(reqs)
        cached = 0
        try:
            async for i, ev in events:
                counts[i] += len(ev.token_ids)
                cached += ev.cached_tokens
                if ev.text or ev.finished:
                    yield f"data: {json.dumps(chunk(i, ev))}\n\n"
        except APIError as e:  # the stream has begun: the error goes in it, as OpenAI's does
            yield f"data: {json.dumps({'error': {'message': e.message, 'type': e.kind}})}\n\n"
            return
        if include_usage:
            usage = _usage_of(sum(len(r.prompt_ids) for r in reqs) // n, sum(counts), cached)
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")
