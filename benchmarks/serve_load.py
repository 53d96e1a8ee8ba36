"""`gearshift serve` under load: concurrent streamed completions over HTTP, as a client sees them.

`gearshift bench` times the engine alone; this adds what a server costs on top (HTTP, SSE, tokenizing,
the engine thread's hand-offs) and what queueing for KV slots does to latency. For each concurrency level it
keeps that many requests in flight (each a fresh random text prompt, greedy unless `--sampling` says otherwise,
`ignore_eos`, `--gen-len` tokens, streamed) until `--requests` have finished, and reports per level:
requests/s, output tokens/s, time to first token (median, p90), time per output token after the first
(median), and end-to-end latency (median).
Both times are when text arrives; the JSON's `text_chunks_per_token` says how closely that follows the tokens,
and a level where it is under 0.5 is warned about.

Either start a server yourself and pass `--url`, or let the script start `gearshift serve` on a free port with
`--model PATH` and the serve options after `--` (e.g. `-- --policy qspec --draft-mode w4a8`). A server that
wants an API key gets $GEARSHIFT_API_KEY.

Usage: python benchmarks/serve_load.py --model PATH [--concurrency 1,4,16] [--requests N] [--gen-len 128]
       [--prompt-words 100] [--sampling '{"temperature": 0.7}'] [--sample-stacks] [--out DIR] [-- SERVE OPTIONS...]
writes DIR/serve_load_<device>.json (the device the server reports in /stats), prints a table last.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the of and to in is was for on that with as by at from his her an be this which or had not are but "
         "were they one all their there been has when who more will would no if out so said what up its about "
         "into than them can only other new some could time these two may then do first any my now such like our "
         "over man me even most made after also did many before must through back years where much your way well "
         "down should because each just those people how too little state good very make world still own see men "
         "work long get here between both life being under never day same another know while last might us great "
         "old year off come since against go came right used take three").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, serve_args: list[str], port: int, wait_s: float, log: Path,
                 stacks: Path | None = None) -> tuple[subprocess.Popen, float]:
    """`gearshift serve` in a subprocess, its output in `log` (a pipe nobody reads would fill and stop the
    server after some hundred access-log lines); returns it and the seconds until /health answered
    (load, quantization and warm-up). `stacks`: a folder for `stack_sampler`'s dumps of the server."""
    paths = ([str(ROOT / "benchmarks" / "stack_sampler")] if stacks else []) + [str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")])}
    if stacks:
        stacks.mkdir(parents=True, exist_ok=True)
        env["STACK_OUT"] = str(stacks)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gearshift", "serve", "--model", model, "--port", str(port),
                                 *serve_args], stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait_s:
        if proc.poll() is not None:
            raise SystemExit(f"gearshift serve exited with code {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"gearshift serve did not answer /health within {wait_s:.0f} s:\n{log.read_text()[-4000:]}")


async def one_request(client: httpx.AsyncClient, url: str, prompt: str, gen_len: int, sampling: dict) -> dict:
    """One streamed completion: when its first text arrived, when it ended, and its token counts."""
    body = {"prompt": prompt, "max_tokens": gen_len, "temperature": 0, **sampling, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, usage, chunks = None, None, 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"the server answered {r.status_code}: {(await r.aread()).decode()[:500]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("choices") and chunk["choices"][0]["text"]:
                chunks += 1
                if first is None:
                    first = time.perf_counter()
            if chunk.get("usage"):
                usage = chunk["usage"]
    end = time.perf_counter()
    n = usage["completion_tokens"] if usage else 0
    return {"ttft_s": (first or end) - t0, "latency_s": end - t0, "completion_tokens": n, "text_chunks": chunks,
            "prompt_tokens": usage["prompt_tokens"] if usage else 0,
            "tpot_s": (end - first) / (n - 1) if first is not None and n > 1 else None}


async def run_level(url: str, concurrency: int, requests: int, gen_len: int, words: int, seed: int,
                    sampling: dict) -> dict:
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(requests)]
    sem = asyncio.Semaphore(concurrency)
    key = os.environ.get("GEARSHIFT_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(timeout=None, headers=headers,
                                 limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        async def limited(p):
            async with sem:
                return await one_request(client, url, p, gen_len, sampling)
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(limited(p) for p in prompts))
        wall = time.perf_counter() - t0
    ttft = sorted(r["ttft_s"] for r in rows)
    tpot = [r["tpot_s"] for r in rows if r["tpot_s"] is not None]
    out_tokens = sum(r["completion_tokens"] for r in rows)
    return {"concurrency": concurrency, "requests": requests, "wall_s": wall, "requests_per_s": requests / wall,
            "output_tokens_per_s": out_tokens / wall, "ttft_median_ms": 1e3 * statistics.median(ttft),
            "ttft_p90_ms": 1e3 * ttft[min(len(ttft) - 1, int(0.9 * len(ttft)))],
            "tpot_median_ms": 1e3 * statistics.median(tpot) if tpot else None,
            "latency_median_ms": 1e3 * statistics.median(r["latency_s"] for r in rows),
            "prompt_tokens_mean": statistics.mean(r["prompt_tokens"] for r in rows),
            "text_chunks_per_token": sum(r["text_chunks"] for r in rows) / max(1, out_tokens), "per_request": rows}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    where.add_argument("--model", help="start `gearshift serve --model MODEL` (and the options after --)")
    ap.add_argument("--concurrency", default="1,4,16", help="requests in flight, per level (comma-separated)")
    ap.add_argument("--requests", type=int, default=None, help="requests per level (default: 4 x concurrency, "
                                                              "at least 8)")
    ap.add_argument("--gen-len", type=int, default=128, help="tokens generated per request (default: 128)")
    ap.add_argument("--prompt-words", type=int, default=100, help="random words per prompt (default: 100)")
    ap.add_argument("--warmup", type=int, default=2, help="rounds of `concurrency` requests each level sends first "
                                                         "and does not count (kernel compiles and CUDA graphs for its "
                                                         "batch sizes; default: 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wait", type=float, default=600, help="seconds to wait for a started server (default: 600)")
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON")
    ap.add_argument("--tag", default="", help="suffix of the JSON's name")
    ap.add_argument("--sampling", default="{}", help='request fields over greedy, as JSON, e.g. '
                    '\'{"temperature": 0.7, "top_p": 0.9}\' (default: greedy)')
    ap.add_argument("--sample-stacks", action="store_true", help="sample the started server's threads every 10 ms "
                    "into OUT/stacks<tag>/ (benchmarks/stack_sampler; read with benchmarks/stall_report.py)")
    a = ap.parse_args(argv)
    levels = [int(v) for v in a.concurrency.split(",")]
    if min(levels) < 1 or a.gen_len < 1 or a.prompt_words < 1:
        ap.error("--concurrency, --gen-len and --prompt-words take positive numbers")
    try:
        sampling = json.loads(a.sampling)
        assert isinstance(sampling, dict)
    except (ValueError, AssertionError):
        ap.error(f"--sampling takes a JSON object of request fields, not {a.sampling!r}")
    if a.sample_stacks and not a.model:
        ap.error("--sample-stacks samples a server this script starts (--model)")
    proc, startup_s = None, None
    url = a.url
    if a.model:
        port = free_port()
        log = Path(a.out) / f"serve_load_server{a.tag}.log"
        stacks = Path(a.out) / f"stacks{a.tag}" if a.sample_stacks else None
        proc, startup_s = start_server(a.model, serve_args, port, a.wait, log, stacks)
        print(f"server up after {startup_s:.1f} s (its output: {log})", flush=True)
        url = f"http://127.0.0.1:{port}"
    try:
        stats = httpx.get(f"{url}/stats", timeout=10).json()
        results = []
        for c in levels:  # each level warms its own batch sizes: a first batch of 4 compiles and captures graphs
            if a.warmup:
                asyncio.run(run_level(url, c, a.warmup * c, a.gen_len, a.prompt_words, a.seed + 10_000 + c,
                                      sampling))
            results.append(asyncio.run(run_level(url, c, a.requests or max(8, 4 * c), a.gen_len, a.prompt_words,
                                                 a.seed + c, sampling)))
        after = httpx.get(f"{url}/stats", timeout=10).json()  # stalls while serving: shapes the warm-up missed
        compiles = {k: after[k] for k in ("kernel_compiles_while_serving", "kernel_compile_seconds_while_serving",
                                          "cuda_graph_captures_while_serving",
                                          "cuda_graph_capture_seconds_while_serving",
                                          "cuda_graph_shapes_while_serving") if k in after}
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    device = stats.get("device", "unknown")
    out = Path(a.out) / f"serve_load_{re.sub(r'[^A-Za-z0-9_.-]+', '_', device).strip('_')}{a.tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": device, "server": {k: stats.get(k) for k in (
        "policy", "mode", "modes", "batch_size", "max_model_len", "prefix_reuse")}, "serve_args": serve_args,
        "startup_s": startup_s, **compiles, "sampling": sampling, "gen_len": a.gen_len,
        "prompt_words": a.prompt_words, "levels": results},
        indent=1))
    print(f"{device}; policy {stats.get('policy')} ({stats.get('mode')}), {stats.get('batch_size')} KV slots; "
          f"{a.gen_len} tokens per request; {out}")
    if compiles.get("kernel_compiles_while_serving"):
        print(f"the server compiled {compiles['kernel_compiles_while_serving']} Triton kernels while serving "
              f"({compiles.get('kernel_compile_seconds_while_serving')} s; which ones: its log)")
    if compiles.get("cuda_graph_captures_while_serving"):
        print(f"the server captured {compiles['cuda_graph_captures_while_serving']} CUDA graphs while serving "
              f"({compiles.get('cuda_graph_capture_seconds_while_serving')} s)")
        for g in compiles.get("cuda_graph_shapes_while_serving", []):
            print(f"  {g['rows']} rows x {g['tokens']} tokens, context {g['context']}, {g['mode']}, "
                  f"logits {g['logits']}: {g['seconds']} s")
    print(f"{'conc':>4} {'req':>4} {'req/s':>7} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p90':>9} {'TPOT p50':>9} "
          f"{'e2e p50':>8}  (ms)")
    for r in results:
        tpot = f"{r['tpot_median_ms']:9.1f}" if r["tpot_median_ms"] is not None else f"{'-':>9}"
        print(f"{r['concurrency']:>4} {r['requests']:>4} {r['requests_per_s']:7.2f} {r['output_tokens_per_s']:10.1f} "
              f"{r['ttft_median_ms']:9.1f} {r['ttft_p90_ms']:9.1f} {tpot} {r['latency_median_ms']:8.0f}")
    sparse = [r for r in results if r["text_chunks_per_token"] < 0.5]
    fewest = min((r["text_chunks_per_token"] for r in sparse), default=None)
    levels = ", ".join(str(r["concurrency"]) for r in sparse)
    if sparse and stats.get("policy") == "qspec":  # a cycle's accepted tokens arrive together: expected
        print(f"note: at concurrency {levels} {fewest:.2f} text chunks arrived per token: QSPEC streams each cycle's "
              "tokens as one chunk, and TPOT divides the time after the first chunk by the tokens", file=sys.stderr)
    elif sparse:  # TTFT / TPOT time text chunks: where most tokens add no text, they do not time tokens
        print(f"warning: at concurrency {levels} only {fewest:.2f} streamed text chunks arrived per token, so "
              "TTFT and TPOT there time text, not tokens (does the tokenizer decode every id the model samples?)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
