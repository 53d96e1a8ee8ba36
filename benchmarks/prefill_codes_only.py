"""W4A8 / W4A4 prefill through the model (GPU): the producers (RMSNorms, SwiGLU) storing only the
codes the next linear takes (the engine since stop 32) against storing the activations too (what
it did before; a forward pre-hook on qkv, gate_up and down forces that path, as calibration's
hooks do). Same logits bit for bit is checked; the two alternate, medians of CUDA-event times.
Llama-3-8B shapes, random int4-prog weights, one sequence, eager (prefill is GPU-bound).

    PYTHONPATH=. python benchmarks/prefill_codes_only.py --tokens 1024,4096 --out benchmarks/results
"""
import argparse
import json
import statistics
from pathlib import Path

import torch

from gearshift.model.tiny import build_random_model


def once(run):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    out = run()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1024,4096")
    ap.add_argument("--modes", default="w4a8,w4a4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    m = build_random_model("llama3-8b", weights="int4-prog")
    lins = [lin for layer in m.model.layers
            for lin in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    rows = []
    for mode in a.modes.split(","):
        for n in (int(v) for v in a.tokens.split(",")):
            ids = torch.randint(0, 1000, (1, n), device="cuda")
            cache = m.new_cache(1, n + 1)

            def run():
                return m(ids, cache, [0], [n], mode=mode, logits="last")

            t, outs = {"codes_only": [], "stored": []}, {}
            with torch.no_grad():
                for _ in range(2):  # warm-up
                    once(run)
                for _ in range(a.rounds):
                    for side in t:
                        hooks = ([lin.register_forward_pre_hook(lambda mod, args: None) for lin in lins]
                                 if side == "stored" else [])
                        ms, outs[side] = once(run)
                        for h in hooks:
                            h.remove()
                        t[side].append(ms)
            med = {k: statistics.median(v) for k, v in t.items()}
            same = bool(torch.equal(outs["codes_only"], outs["stored"]))
            rows.append({"mode": mode, "tokens": n, "same_logits": same, "ms": t, "median": med})
            print(f"{mode} {n} tokens: codes only {med['codes_only']:.2f} ms, stored {med['stored']:.2f} ms, "
                  f"ratio {med['codes_only'] / med['stored']:.3f}, same logits {same}", flush=True)
    dev = torch.cuda.get_device_name()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"prefill_codes_only_{dev.replace(' ', '_')}.json").write_text(
        json.dumps({"device": dev, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
