"""The request loop: FCFS admission into KV slots, continuous refill, stop handling, streaming.

Requests wait in a queue; whenever slots are free the next ones are prefilled together and
join the running batch (ORCA-style continuous batching, as in the QSPEC paper's serving
setup). The decode policy produces tokens; the engine decides when a sequence is done and
trims anything a policy produced past a stop (QSPEC can accept tokens beyond an EOS).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from gearshift.decode.base import DecodePolicy, Sequence
from gearshift.decode.sampling import SamplingParams, sample_rows
from gearshift.engine.detokenize import IncrementalDetokenizer
from gearshift.errors import GearshiftError
from gearshift.model.loader import LoadedModel


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    mode: str | None = None  # a precision mode of a policy that serves several (PerRequestModePolicy)


@dataclass
class Result:
    token_ids: list[int]
    text: str | None
    finish_reason: str
    prompt_tokens: int
    stats: dict = field(default_factory=dict)


@dataclass
class StreamEvent:
    index: int  # which request
    token_ids: list[int]  # tokens added since the last event for this request
    text: str  # text added since the last event
    finished: bool
    finish_reason: str | None = None
    full_text: str | None = None  # on the last event: the whole output's text, cut at a stop string
    cached_tokens: int = 0  # on the last event: prompt tokens whose K/V were reused, not prefilled


def _sequence(index: int, r: Request) -> Sequence:
    return Sequence(index, list(r.prompt_ids), r.params, mode=r.mode)


class Engine:
    def __init__(self, loaded: LoadedModel, max_batch: int = 8, max_seq_len: int | None = None):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.max_batch = max_batch
        self.max_seq_len = max_seq_len or loaded.config.max_position_embeddings
        self.last_stats: dict = {}
        self._cache = None  # the last run's KV cache, while no run holds it (`_take_cache`)

    # -- text helpers ------------------------------------------------------------------------
    def encode_prompt(self, prompt: str, chat: bool | None = None, system: str | None = None) -> list[int]:
        if self.tokenizer is None:
            raise GearshiftError(f"{self.loaded.source} has no tokenizer; pass token ids instead of text")
        use_chat = chat if chat is not None else bool(getattr(self.tokenizer, "chat_template", None))
        if use_chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise GearshiftError("this model's tokenizer has no chat template; use --no-chat")
            msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            return self.encode_chat(msgs)
        ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        return list(ids)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """A conversation ({"role", "content"} dicts) through the chat template, ready for the assistant's turn."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def decode(self, ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def eos_ids(self) -> list[int]:
        ids = set(self.loaded.config.eos_token_id)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return sorted(ids)

    # -- generation ----------------------------------------------------------------------------
    def _validate(self, requests: list[Request], clamp: bool = True) -> None:
        """Prompts must be token ids of this vocabulary that leave room in the context; `clamp` cuts
        max_new_tokens to the room left (a server checks that with `check_fits` instead)."""
        vocab = self.loaded.config.vocab_size
        for i, r in enumerate(requests):
            if not r.prompt_ids:
                raise GearshiftError(f"prompt {i} is empty")
            if max(r.prompt_ids) >= vocab or min(r.prompt_ids) < 0:
                raise GearshiftError(f"prompt {i} has token ids outside the vocabulary (0..{vocab - 1})")
            need = len(r.prompt_ids) + r.params.max_new_tokens
            if len(r.prompt_ids) >= self.max_seq_len:
                raise GearshiftError(f"prompt {i} has {len(r.prompt_ids)} tokens; the context holds {self.max_seq_len}")
            if clamp and need > self.max_seq_len:
                r.params.max_new_tokens = self.max_seq_len - len(r.prompt_ids)

    def stream(self, requests: list[Request], policy: DecodePolicy, events: bool = True) -> Iterator[StreamEvent]:
        """Generate for every request, yielding token/text increments as they are produced
        (events=False: yield nothing, skip the per-step detokenization; results are in
        self.sequences)."""
        self._validate(requests)
        batch = min(self.max_batch, len(requests))
        capacity = max(len(r.prompt_ids) + r.params.max_new_tokens for r in requests) + policy.lookahead + 1
        for r in requests:
            self.check_request(r, policy)
        queue = deque(_sequence(i, r) for i, r in enumerate(requests))
        self.sequences: list[Sequence] = []
        timing = yield from self._run(queue, policy, batch, capacity, events, admitted=self.sequences.extend)
        wall = timing["wall_s"]
        generated = sum(len(s.output) for s in self.sequences)
        first = timing["first_token_at"]
        self.last_stats = {
            "policy": policy.name,
            "mode": policy.mode,
            "requests": len(requests),
            "batch": batch,
            "generated_tokens": generated,
            "wall_s": round(wall, 4),
            "tokens_per_s": round(generated / wall, 3) if wall > 0 else None,
            "mean_time_to_first_token_s": round(sum(first.values()) / max(len(first), 1), 4),
            **policy.stats(),
        }

    def serve(self, pull: Callable[[bool], list[tuple[int, Request]] | None], policy: DecodePolicy,
              aborted: set[int] | None = None, prefix_reuse: bool = True) -> Iterator[StreamEvent]:
        """The request loop of a server: requests arrive while others decode. `pull(idle)` returns the
        (id, request) pairs that came in since it was last called (blocking for one when `idle`, i.e. nothing
        is queued or decoding), or None once no more will come; the loop then finishes what it holds. Ids in
        `aborted` (a client went away) end at the next step with finish reason "abort" and free their slot.
        The KV cache is sized once, for `max_batch` sequences of `max_seq_len` tokens; requests must fit it
        (`check_fits`). With `prefix_reuse` (and a policy that `reuses_prefix`), a slot keeps the K/V of the
        request that last held it, and a new request whose prompt starts with those tokens (a chat client
        sending the conversation again) takes that slot and prefills only the rest; its last event says how
        many prompt tokens were reused (`cached_tokens`)."""
        aborted = aborted if aborted is not None else set()
        queue: deque[Sequence] = deque()

        def refill(idle: bool) -> bool:
            new = pull(idle)
            if new is None:
                return False
            for rid, r in new:
                self._validate([r], clamp=False)
                self.check_request(r, policy)
                queue.append(_sequence(rid, r))
            return True

        yield from self._run(queue, policy, self.max_batch, self._serving_capacity(policy), True,
                             refill=refill, aborted=aborted, reuse=prefix_reuse and policy.reuses_prefix)

    def run_in_serving_cache(self, requests: list[Request], policy: DecodePolicy) -> None:
        """Run the requests through the loop at the server's batch and context (`max_batch` slots of
        `max_seq_len` tokens), keeping no output: a server's warm-up (`engine.warmup`), whose KV cache, and the
        CUDA graphs keyed on it, the server's loop takes next."""
        self._validate(requests)
        seqs = [_sequence(i, r) for i, r in enumerate(requests)]
        for _ in self._run(deque(seqs), policy, self.max_batch, self._serving_capacity(policy), False):
            pass
        for s in seqs:  # nor any telemetry: GEARBX would keep the warm-up's sequences for the server's life
            policy.forget(s)

    def _serving_capacity(self, policy: DecodePolicy) -> int:
        """KV positions per slot of a server's cache: the context, plus what a step may use beyond it."""
        return self.max_seq_len + policy.lookahead + 1

    @staticmethod
    def check_request(r: Request, policy: DecodePolicy) -> None:
        """What a request asks of the policy (a mode, penalties) that the policy must run as asked."""
        served = policy.modes
        if r.mode is not None and r.mode not in served:
            raise GearshiftError(f"mode {r.mode!r} asked for, but the {policy.name} policy runs "
                                 f"{', '.join(served)}")
        if r.params.penalized and not policy.penalties:
            raise GearshiftError(f"repetition / frequency / presence penalties and logit_bias need the ar policy; "
                                 f"the {policy.name} policy samples without them")

    def check_fits(self, prompt_ids: list[int], max_new_tokens: int) -> None:
        """A server's requests must fit the context as asked: it refuses them rather than cut them short."""
        if len(prompt_ids) + max_new_tokens > self.max_seq_len:
            raise GearshiftError(f"the prompt's {len(prompt_ids)} tokens and max_tokens {max_new_tokens} exceed the "
                                 f"context of {self.max_seq_len} tokens")

    def _run(self, queue: deque, policy: DecodePolicy, batch: int, capacity: int, events: bool,
             admitted: Callable[[list[Sequence]], None] | None = None,
             refill: Callable[[bool], bool] | None = None, aborted: set[int] = frozenset(), reuse: bool = False):
        """FCFS admission into `batch` KV slots and decode steps until nothing is left (and `refill`, where
        given, says no more will come). Returns the wall time and each request's time to first token."""
        eos = self.eos_ids()
        cache = self._take_cache(batch, capacity)
        ended = False
        try:
            timing = yield from self._loop(cache, queue, policy, batch, events, admitted, refill, aborted, reuse, eos)
            ended = True
            return timing
        finally:
            if not ended:  # closed early or failed: leave no step launched ahead for the next run to meet
                with contextlib.suppress(Exception):
                    policy.finish()
            self._cache = cache  # the next run of this size takes it again

    def _take_cache(self, batch: int, capacity: int):
        """The last run's KV cache when it has this size, else a new one. Every captured CUDA graph is
        keyed on the cache's addresses, so a new cache per run would capture them all again (100-200 ms
        a graph at 8B scale, inside the next run's TTFT), besides allocating GBs per call. A run takes
        the cache out while it holds it: runs interleaved on one engine each get their own."""
        cache, self._cache = self._cache, None
        if cache is None or cache.batch != batch or cache.capacity != capacity:
            del cache  # before allocating the new one
            return self.model.new_cache(batch, capacity)
        for slot in range(batch):  # lengths 0: what the slots still hold is masked, then overwritten
            cache.reset(slot)
        return cache

    def _loop(self, cache, queue: deque, policy: DecodePolicy, batch: int, events: bool, admitted, refill,
              aborted, reuse: bool, eos: list[int]):
        policy.bind(cache)
        free = list(range(batch))
        active: list[Sequence] = []
        emitted_text: dict[int, str] = {}
        emitted_tokens: dict[int, int] = {}
        self._texts: dict[int, IncrementalDetokenizer] = {}  # per request index: streamed text so far
        t0 = time.perf_counter()
        first_token_at: dict[int, float] = {}
        open_ = True
        held: dict[int, tuple] = {}  # reuse: slot -> (mode, the tokens whose K/V it holds), from its last request

        def release(s: Sequence) -> None:
            free.append(s.slot)
            if reuse:
                held[s.slot] = (s.mode or policy.mode, (s.prompt + s.output)[:cache.lengths[s.slot]])

        def take_slot(s: Sequence) -> int:
            """The free slot holding the longest start of this prompt in its mode (reuse), else the lowest free
            one that holds nothing (so a conversation's K/V outlives unrelated requests while slots allow), else
            the lowest free one: a decode step runs the slots through the highest one in use (`decode_width`)."""
            best, keep = min((slot for slot in free if slot not in held), default=min(free)), 0
            for slot in free if reuse else ():
                mode, tokens = held.get(slot, (None, []))
                if mode != (s.mode or policy.mode):
                    continue
                n = len(os.path.commonprefix([tokens, s.prompt[:-1]]))  # the last token is fed by a step
                if n > keep:
                    best, keep = slot, n
            free.remove(best)
            held.pop(best, None)
            cache.reset(best)
            if keep:
                cache.lengths[best] = keep
            s.cached = keep
            return best

        def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
            return sample_rows(logits, [s.params for s in seqs], [s.generator for s in seqs],
                               [(s.prompt, s.output) for s in seqs])

        def done(s: Sequence) -> None:  # what a finished request leaves behind (a server runs for days)
            emitted_text.pop(s.index, None)
            emitted_tokens.pop(s.index, None)
            self._texts.pop(s.index, None)
            if refill is not None:  # a server reports no run statistics, nor keeps telemetry per request
                first_token_at.pop(s.index, None)
                policy.forget(s)

        while True:
            if refill is not None and open_:
                open_ = refill(not queue and not active)
            if not (queue or active):
                break
            if aborted:
                for s in [s for s in queue if s.index in aborted]:
                    queue.remove(s)
                    s.finished, s.finish_reason = True, "abort"
                    aborted.discard(s.index)
                    yield StreamEvent(s.index, [], "", True, "abort", full_text="")
                for s in [s for s in active if s.index in aborted]:
                    s.finished, s.finish_reason = True, "abort"
                    aborted.discard(s.index)
                    active.remove(s)
                    release(s)
                    done(s)
                    yield StreamEvent(s.index, [], "", True, "abort", full_text="")
            if queue and free:
                new = []
                while queue and free:
                    s = queue.popleft()
                    s.slot = take_slot(s)
                    s.generator = s.params.make_generator(policy.sample_device)
                    new.append(s)
                if admitted is not None:
                    admitted(new)
                policy.prefill(new, sample)
                active.extend(new)
            if not active:
                continue
            policy.step(active, sample)
            now = time.perf_counter()
            for s in list(active):
                first_token_at.setdefault(s.index, now - t0)
                self._check_stop(s, eos)
                ev = self._event(s, emitted_text, emitted_tokens) if events else None
                if s.finished:  # before its last event goes out: whoever reads it finds the slot free
                    active.remove(s)
                    release(s)
                    done(s)
                if ev is not None:
                    yield ev
        policy.finish()
        return {"wall_s": time.perf_counter() - t0, "first_token_at": first_token_at}

    def _check_stop(self, s: Sequence, eos: list[int]) -> None:
        p = s.params
        stops = p.stop_token_ids if p.stop_token_ids is not None else ([] if p.ignore_eos else eos)
        if stops:  # only the tokens added since the last check: O(new tokens) per step, not O(output)
            for i in range(min(s.checked, len(s.output)), len(s.output)):
                if s.output[i] in stops:
                    del s.output[i + 1:]
                    s.finished, s.finish_reason = True, "stop"
                    break
        s.checked = len(s.output)
        if len(s.output) >= p.max_new_tokens:
            del s.output[p.max_new_tokens:]
            if not s.finished:
                s.finished, s.finish_reason = True, "length"
        if p.stop and self.tokenizer is not None:
            # only text the new tokens added can hold a stop string that was not there before
            texts = self._text(s)
            searched = len(texts.text)
            texts.update(s.output)
            text = texts.text
            lo = max(0, searched - max(len(x) for x in p.stop) + 1)
            hits = [i for i in (text.find(x, lo) for x in p.stop) if i >= 0]
            if hits:
                cut = min(hits)
                # keep the fewest tokens whose text contains the stop string: it is in this step's
                # tokens, so count back from the end (one decode per token dropped)
                n = len(s.output)
                while n > 1 and len(self.decode(s.output[:n - 1])) > cut:
                    n -= 1
                del s.output[n:]
                s.finished, s.finish_reason = True, "stop"
                s.stats["stop_text_at"] = cut

    def _text(self, s: Sequence) -> IncrementalDetokenizer:
        t = self._texts.get(s.index)
        if t is None:
            t = self._texts[s.index] = IncrementalDetokenizer(self.tokenizer)
        return t

    def _event(self, s: Sequence, emitted_text: dict, emitted_tokens: dict) -> StreamEvent | None:
        n_prev = emitted_tokens.get(s.index, 0)
        new_ids = s.output[n_prev:]
        if not new_ids and not s.finished:
            return None
        if s.finished or self.tokenizer is None:
            text = self.result_text(s) or ""  # the whole output decoded once, at the end
        else:  # O(new tokens) per step; holds back an incomplete character
            texts = self._text(s)
            texts.update(s.output)
            text = texts.text
            if s.params.stop:  # and what may be the start of a stop string (the final text is cut before it)
                text = text[: max(0, len(text) - max(len(x) for x in s.params.stop) + 1)]
        prev = emitted_text.get(s.index, "")
        if not s.finished and (text.endswith("\ufffd") or text == prev):  # nothing new to show yet
            return None
        emitted_tokens[s.index] = len(s.output)
        emitted_text[s.index] = text
        return StreamEvent(s.index, new_ids, text[len(prev):] if text.startswith(prev) else text, s.finished,
                           s.finish_reason, full_text=text if s.finished else None,
                           cached_tokens=s.cached if s.finished else 0)

    def result_text(self, s: Sequence) -> str | None:
        text = self.decode(s.output)
        if text is not None and "stop_text_at" in s.stats:
            text = text[: s.stats["stop_text_at"]]
        return text

    def generate(self, requests: list[Request], policy: DecodePolicy,
                 on_event: Callable[[StreamEvent], None] | None = None) -> list[Result]:
        for ev in self.stream(requests, policy, events=on_event is not None):
            on_event(ev)
        results: list[Result | None] = [None] * len(requests)
        for s in self.sequences:
            results[s.index] = Result(list(s.output), self.result_text(s), s.finish_reason or "length",
                                      len(s.prompt), dict(s.stats))
        return results  # type: ignore[return-value]
