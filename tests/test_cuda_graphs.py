"""CUDA-graph replay keys (model/cuda_graphs.py): a graph is replayed only under the setting it was
captured with. The switches' part is in test_decode_attention.py; here, the dispatcher's."""

import pytest
import torch

GPU = torch.cuda.is_available()


@pytest.mark.skipif(not GPU, reason="CUDA graphs")
def test_graphs_are_keyed_by_the_dispatcher():
    """Installing another dispatcher (another policy map) between steps must not replay graphs
    whose kernels the previous one chose."""
    from gearshift.dispatch import AdaptiveDispatcher, get_dispatcher, set_dispatcher
    from gearshift.model.tiny import build_random_model

    torch.manual_seed(0)
    model = build_random_model("tiny", weights="int4", device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 512, (2, 4), device="cuda")

    installed = get_dispatcher()
    model.use_cuda_graphs = True
    try:
        cache = model.new_cache(2, 16)
        model(ids, cache, [0] * 2, [4] * 2, mode="w4a16")

        def step():  # the same decode step again (it rewrites the same cache entries)
            return model(ids[:, -1:], cache, [4] * 2, [1] * 2, mode="w4a16")

        first = step()
        n = model._graphs.captures
        assert step().equal(first) and model._graphs.captures == n  # same dispatcher: replayed
        set_dispatcher(AdaptiveDispatcher())
        assert step().equal(first)  # (the same map: the same kernels and bits)
        assert model._graphs.captures == n + 1  # but a new dispatcher: captured anew
    finally:
        set_dispatcher(installed)
        model.use_cuda_graphs = False
