"""Prometheus metrics of a running server, read from `EngineWorker.stats()` at scrape time (no second
set of counters to keep in step)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily


class WorkerCollector:
    def __init__(self, worker):
        self.worker = worker

    def collect(self):
        s = self.worker.stats()
        info = InfoMetricFamily("gearshift_server", "what the server runs")
        info.add_metric([], {"device": str(s["device"]), "policy": str(s["policy"]), "mode": str(s["mode"]),
                             "modes": ",".join(s["modes"]), "prefix_reuse": str(s["prefix_reuse"]).lower()})
        yield info
        for name, doc, value in (
                ("gearshift_up", "1 while the engine thread runs", int(bool(s["alive"]))),
                ("gearshift_requests_running", "requests holding a KV slot or waiting for one in the engine",
                 s["requests_in_engine"]),
                ("gearshift_requests_queued", "requests not yet taken by the engine thread", s["requests_queued"]),
                ("gearshift_kv_slots", "sequences decoded together (--batch-size)", s["batch_size"]),
                ("gearshift_max_model_len", "tokens per sequence the KV cache holds", s["max_model_len"])):
            yield GaugeMetricFamily(name, doc, value=value)
        finished = CounterMetricFamily("gearshift_requests_finished", "requests finished, by reason",
                                       labels=["reason"])
        for reason, n in sorted(s["requests_finished"].items()):
            finished.add_metric([reason], n)
        yield finished
        for name, doc, value in (
                ("gearshift_generated_tokens", "tokens generated", s["generated_tokens"]),
                ("gearshift_prompt_tokens_reused", "prompt tokens served from a kept KV prefix",
                 s["prompt_tokens_reused"]),
                ("gearshift_prompts_scored", "scoring forwards (echo / logprobs)", s["prompts_scored"]),
                ("gearshift_kernel_compiles_while_serving", "Triton compiles after the warm-up (batch stalls)",
                 s.get("kernel_compiles_while_serving")),
                ("gearshift_cuda_graph_captures_while_serving",
                 "CUDA graph captures after the warm-up (batch stalls)", s.get("cuda_graph_captures_while_serving"))):
            if value is not None:
                yield CounterMetricFamily(name, doc, value=value)
        for name, doc, hist in (
                ("gearshift_time_to_first_token_seconds", "submit to first token", s["time_to_first_token"]),
                ("gearshift_request_latency_seconds", "submit to the last token of a finished request",
                 s["request_latency"])):
            cumulative, buckets = 0, []
            for bound, n in hist["buckets"].items():
                cumulative += n
                buckets.append((bound, cumulative))
            yield HistogramMetricFamily(name, doc, buckets=buckets, sum_value=hist["sum_s"])


def registry_for(worker) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
    return registry
