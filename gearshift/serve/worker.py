"""The engine's request loop on a thread of its own, fed by the HTTP handlers.

One thread owns the model, the KV cache and the decode policy for the server's lifetime, so
requests that arrive while others decode join the running batch (`Engine.serve`). Handlers
submit a request with a callback; the callback receives the request's `StreamEvent`s (and an
exception if the loop dies) on the engine thread and must hand them over without blocking.
Scoring jobs (`score`) run on the same thread, between two steps of the batch.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from gearshift.decode.base import DecodePolicy
from gearshift.engine.engine import Engine, Request, StreamEvent
from gearshift.errors import GearshiftError

Sink = Callable[[StreamEvent | BaseException], None]


#: upper bounds (s) of the latency histograms' buckets, as Prometheus histograms take them
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0)


class LatencyHistogram:
    """Counts per bucket and the sum of the observed seconds: what /stats and /metrics report of a latency."""

    def __init__(self):
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last bucket: above every bound
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[next((i for i, b in enumerate(LATENCY_BUCKETS) if seconds <= b), len(LATENCY_BUCKETS))] += 1
        self.sum += seconds

    def summary(self) -> dict:
        n = sum(self.counts)
        return {"count": n, "sum_s": self.sum, "mean_s": self.sum / n if n else None,
                "buckets": dict(zip([*map(str, LATENCY_BUCKETS), "+Inf"], self.counts, strict=True))}


@dataclass
class _ScoreJob:
    ids: list[int]
    mode: str
    top: int


class EngineWorker:
    def __init__(self, engine: Engine, policy: DecodePolicy, prefix_reuse: bool = True):
        self.engine, self.policy = engine, policy
        self.prefix_reuse = prefix_reuse and policy.reuses_prefix
        self._inbox: queue.Queue[tuple[int, Request | _ScoreJob, Callable] | None] = queue.Queue()
        self._sinks: dict[int, Sink] = {}
        self._aborted: set[int] = set()
        self._cancelled: set[int] = set()  # cancelled by a handler, not yet seen by the loop
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self.error: BaseException | None = None
        self.finished: Counter[str] = Counter()  # requests ended, by finish reason
        self.generated_tokens = 0
        self.prompt_tokens_reused = 0
        self.scored = 0  # scoring requests (echo + logprobs) run
        self._submitted: dict[int, float] = {}  # request id -> when it was submitted (perf_counter)
        self._first: set[int] = set()  # requests whose first token went out
        self.ttft = LatencyHistogram()  # submit -> first token, as the engine thread hands it over
        self.latency = LatencyHistogram()  # submit -> last event, for requests that finished (not aborted)
        self._closed = False  # the loop has seen close(): it takes nothing more from the inbox
        self._stopped = False  # the loop has ended: submit refuses
        self._thread = threading.Thread(target=self._main, name="gearshift-engine", daemon=True)
        self.compile_watch = None  # a started `CompileWatch` (the server's, after its warm-up), stopped at close
        self._graphs_at_start = self._graph_captures()  # (captures, seconds) the warm-up left
        device = engine.model.device
        self.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)

    def start(self) -> "EngineWorker":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    def submit(self, request: Request, sink: Sink) -> int:
        """Queue a request; returns its id (for `cancel`)."""
        with self._lock:
            if self._stopped or not self._thread.is_alive():
                raise GearshiftError(f"the engine has stopped: {self.error!r}" if self.error
                                     else "the engine is not running")
            rid = next(self._ids)
            self._submitted[rid] = time.perf_counter()
            self._inbox.put((rid, request, sink))
        return rid

    def stats(self) -> dict:
        """What the loop holds and has done, for /stats (read from another thread: a snapshot, not a lock)."""
        return {"device": self.device_name, "policy": self.policy.name, "mode": self.policy.mode,
                "modes": list(self.policy.modes), "alive": self.alive,
                "requests_in_engine": len(self._sinks), "requests_queued": self._inbox.qsize(),
                "requests_finished": dict(self.finished), "generated_tokens": self.generated_tokens,
                "prefix_reuse": self.prefix_reuse, "prompt_tokens_reused": self.prompt_tokens_reused,
                "prompts_scored": self.scored,
                "batch_size": self.engine.max_batch, "max_model_len": self.engine.max_seq_len,
                "time_to_first_token": self.ttft.summary(), "request_latency": self.latency.summary(),
                **self._stalls()}

    def _stalls(self) -> dict:
        """Triton compiles and CUDA graph captures since the worker was made (after a server's warm-up): each
        stalled the running batch, at a shape the warm-up did not cover."""
        out = {}
        w = self.compile_watch
        if w is not None:
            events = list(w.events)
            out = {"kernel_compiles_while_serving": len(events),
                   "kernel_compile_seconds_while_serving": round(sum(e.seconds for e in events), 3)}
        if self._graphs_at_start is not None:
            n, sec = self._graph_captures()
            new = n - self._graphs_at_start[0]
            recent = list(self.engine.model._graph_runner().recent)
            out.update(cuda_graph_captures_while_serving=new,
                       cuda_graph_capture_seconds_while_serving=round(sec - self._graphs_at_start[1], 3),
                       cuda_graph_shapes_while_serving=recent[len(recent) - min(new, len(recent)):])
        return out

    def _graph_captures(self) -> tuple[int, float] | None:
        """(captures, seconds) of the model's CUDA graph runner; None where the model captures none."""
        model = self.engine.model
        if not (getattr(model, "use_cuda_graphs", False) and model.device.type == "cuda"):
            return None
        runner = model._graph_runner()
        return runner.captures, runner.capture_s

    def cancel(self, rid: int) -> None:
        """The client went away: end the request at the next step and free its KV slot."""
        with self._lock:
            self._cancelled.add(rid)

    def close(self, timeout: float | None = None) -> None:
        """Take no more requests, finish the ones held, and stop the thread."""
        self._inbox.put(None)
        self._thread.join(timeout)
        if self.compile_watch is not None:
            self.compile_watch.stop()

    def score(self, ids: list[int], mode: str | None, top: int, sink: Callable) -> None:
        """Queue a scoring forward of a prompt (`engine.scoring.score_prompt`); it runs on the engine thread
        between two steps of the batch, and `sink` gets its PromptScores (or the exception it raised)."""
        with self._lock:
            if self._stopped or not self._thread.is_alive():
                raise GearshiftError("the engine is not running")
            self._inbox.put((-1, _ScoreJob(list(ids), mode or self.policy.mode, top), sink))

    def _pull(self, idle: bool) -> list[tuple[int, Request]] | None:
        """The engine's pull: new requests (blocking for one when `idle`); scoring jobs run here, in between."""
        new: list[tuple[int, Request]] = []
        while not self._closed:
            block = idle and not new
            items = []
            try:
                items.append(self._inbox.get() if block else self._inbox.get_nowait())
                while items[-1] is not None:
                    items.append(self._inbox.get_nowait())
            except queue.Empty:
                pass
            if items and items[-1] is None:
                self._closed = True
                items.pop()
            for rid, payload, sink in items:
                if isinstance(payload, _ScoreJob):
                    self._score(payload, sink)
                else:
                    self._sinks[rid] = sink
                    new.append((rid, payload))
            if not block or new:
                break
        with self._lock:
            self._aborted |= {rid for rid in self._cancelled if rid in self._sinks}
            self._cancelled -= self._aborted
        return None if self._closed and not new else new

    def _score(self, job: "_ScoreJob", sink: Callable) -> None:
        from gearshift.engine.scoring import score_prompt

        try:
            out = score_prompt(self.engine.model, job.ids, job.mode, job.top)
        except Exception as e:  # noqa: BLE001 - a failed scoring fails its request, not the server
            out = e
        self.scored += 1
        sink(out)

    def _main(self) -> None:
        try:
            device = self.engine.model.device
            if device.type == "cuda":  # the current device is per thread, and Triton launches on it
                torch.cuda.set_device(device)
            for ev in self.engine.serve(self._pull, self.policy, self._aborted, prefix_reuse=self.prefix_reuse):
                sink = self._sinks[ev.index]
                self.generated_tokens += len(ev.token_ids)
                now = time.perf_counter()
                if ev.token_ids and ev.index not in self._first:
                    self._first.add(ev.index)
                    self.ttft.observe(now - self._submitted[ev.index])
                if ev.finished:
                    if ev.finish_reason != "abort":
                        self.latency.observe(now - self._submitted[ev.index])
                    self._submitted.pop(ev.index, None)
                    self._first.discard(ev.index)
                    del self._sinks[ev.index]
                    self.finished[ev.finish_reason or "length"] += 1
                    self.prompt_tokens_reused += ev.cached_tokens
                sink(ev)
        except BaseException as e:  # the loop is gone: every waiting request must hear it
            self.error = e
        finally:
            with self._lock:
                self._stopped = True
            gone = self.error or GearshiftError("the server is shutting down")
            for sink in self._sinks.values():
                sink(gone)
            self._sinks.clear()
            while True:
                try:
                    it = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if it is not None:
                    it[2](gone)
