"""The per-program timeline of `chain_trace.py`, inside the engine's graphed decode step (GPU; stop 43).

On chains of linears alone an earlier PDL trigger of the fragment kernel took 6-8% off the W4A16 step at
8 / 16 tokens, and in the engine the same trigger made the decode step 6-14% longer (stop 36). This
runs the engine (random-weight 8B model, graphed decode, as `e2e_ab.py`) once per setting of the
kernel switches (`--side NAME=SWITCHES`, repeated: e.g. `--side exit=gemv_trigger=0 --side
loop=gemv_trigger=2`) with every fragment launch traced (`int4_mma_gemv.TRACE`), and reports per
linear role, mean over the layers of the last captured graph's last replay:

- `busy`: from the launch's first program start to its last program end;
- `span`: from the previous linear's last program end to this one's (the kernels between them included);
- `lead`: how long before the previous linear's last end this one's first program started;
- program lives (median) and `drain` (first program end to last);

and the graphed ms per decode step of each side.

    PYTHONPATH=. python benchmarks/mma_ablations/engine_trace.py --batch 8 \\
        --side rule= --side loop=gemv_trigger=2 --out benchmarks/results
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from chain_trace import timeline  # noqa: E402
from e2e import model_for  # noqa: E402
from e2e_ab import parse_switches  # noqa: E402
from kernel_bench import tag_suffix, write_json  # noqa: E402

from gearshift.dispatch.policy import device_slug  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, copy_bandwidth  # noqa: E402
from gearshift.kernels import int4_mma_gemv as mg  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", action="append", required=True, metavar="NAME=SWITCHES",
                    help="a setting of gearshift/kernels/switches.py, e.g. loop=gemv_trigger=2 (rule=: the defaults)")
    ap.add_argument("--mode", default="w4a16", choices=("w4a16",))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("engine_trace.py needs a CUDA GPU")
    from gearshift.decode.autoregressive import AutoregressivePolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request
    from gearshift.kernels import switches
    from gearshift.model.config import ModelConfig
    from gearshift.model.loader import LoadedModel
    from gearshift.model.tiny import preset_config

    sides = dict(s.split("=", 1) for s in a.side)
    cfg = ModelConfig.from_hf_dict(preset_config("llama3-8b"))
    shapes = PRESETS["llama3-8b"]["shapes"]
    model = model_for({}, "llama3-8b", a.mode, False)
    model.use_cuda_graphs = True
    loaded = LoadedModel(model, None, cfg, "llama3-8b")
    by_shape = {(lin.store.out_features, lin.store.in_features): lin.store.nbytes() for _, lin in model.linear_layers()}
    nbytes = [by_shape[(n, k)] for _, n, k in shapes]
    copy_tbs = copy_bandwidth() / 1e12
    gen = torch.Generator().manual_seed(a.batch)
    prompts = [torch.randint(0, cfg.vocab_size, (a.prompt_len,), generator=gen).tolist() for _ in range(a.batch)]
    default = dict(switches.state())
    res = {"device": torch.cuda.get_device_name(), "mode": a.mode, "batch": a.batch, "copy_tbs": copy_tbs,
           "sides": {}}
    per_graph = PRESETS["llama3-8b"]["layers"] * len(shapes)
    for name, spec in sides.items():
        switches.set_switches(**(default | parse_switches(spec)))
        mg.TRACE, mg.TRACE_ARENA = [], torch.full((1 << 21, 4), -1, device="cuda", dtype=torch.int64)
        eng = Engine(loaded, max_batch=a.batch)
        params = SamplingParams(max_new_tokens=a.new_tokens, ignore_eos=True)
        eng.generate([Request(p, params) for p in prompts], AutoregressivePolicy(model, a.mode))  # captures
        launches = mg.TRACE[-per_graph:]  # the last captured graph's linears (its replays rewrite their rows)
        mg.TRACE = None
        ms = []
        for _ in range(3):
            eng.generate([Request(p, params) for p in prompts], AutoregressivePolicy(model, a.mode))
            ms.append(eng.last_stats["decode_s"] / eng.last_stats["forwards"] * 1e3)
        torch.cuda.synchronize()
        mg.TRACE_ARENA = None
        if len(launches) != per_graph or any(int(L["rows"][:, 2].min()) <= 0 for L in launches):
            raise SystemExit(f"side {name}: {len(launches)} traced launches or unwritten rows")
        tl_ = timeline(launches, shapes, nbytes, copy_tbs, wait=False)
        for d in tl_["launches"]:
            d["busy"] = d["end_max"] - d["start_min"]
        for role, s in tl_["shapes"].items():
            sel = [d for d in tl_["launches"][len(shapes):] if d["shape"] == role]
            s["busy"] = statistics.mean(d["busy"] for d in sel)
        res["sides"][name] = {"switches": spec, "ms_per_step": ms, "shapes": tl_["shapes"], "rate": tl_["rate"],
                              "launches": tl_["launches"]}
        print(f"{name} ({spec or 'defaults'}): {statistics.median(ms):.3f} ms per decode step (graphed, batch "
              f"{a.batch}); the linears' bytes over the step's span (other kernels included): "
              f"{tl_['rate']['mean_tbs']:.2f} TB/s")
        print("  role      tile                       busy   span  bytes   lead  program  drain")
        for role, s in tl_["shapes"].items():
            print(f"  {role:8s}  {s['tile']:26s} {s['busy']:5.2f} {s['span']:6.2f} {s['bytes_us']:5.2f} "
                  f"{s['lead']:6.2f}  {s['dur_p50']:6.2f} {s['drain']:6.2f}", flush=True)
    switches.set_switches(**default)
    write_json(a.out, f"engine_trace_{device_slug(res['device'])}{tag_suffix(a.tag)}_{a.mode}_b{a.batch}.json", res)


if __name__ == "__main__":
    main()
