"""Eager vs CUDA-graph logits for each weight store kind, and eager run-to-run spread (GPU)."""

import json

import torch

from gearshift.decode.precision import PrecisionManager
from gearshift.model.tiny import build_random_model


def main():
    torch.manual_seed(0)
    model = build_random_model("llama3-8b", weights="dense", device="cuda", num_hidden_layers=4)
    mgr = PrecisionManager(model, manage="attention+mlp")
    out = {}
    for gear in ("high", "mid", "low"):
        mgr.shift(gear)
        for b in (1, 16):
            toks = torch.randint(0, 1000, (b, 1), device="cuda")
            prompt = torch.randint(0, 1000, (b, 40), device="cuda")
            res = []
            for graphs in (False, False, True, True):
                model.use_cuda_graphs = graphs
                cache = model.new_cache(b, 256)
                model(prompt, cache, [0] * b, [40] * b, mode="native")
                res.append(model(toks, cache, [40] * b, [1] * b, mode="native", logits="last"))
            e2e = (res[0] - res[1]).abs().max().item()
            eg = (res[0] - res[2]).abs().max().item()
            gg = (res[2] - res[3]).abs().max().item()
            out[f"{gear} b{b}"] = {"eager_vs_eager": e2e, "eager_vs_graph": eg, "graph_vs_graph": gg,
                                   "logit_scale": res[0].abs().max().item()}
            print(gear, b, out[f"{gear} b{b}"], flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
