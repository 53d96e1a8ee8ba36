"""PerRequestModePolicy: requests of different precision modes in one batch, each decoding as it would alone."""

import pytest
import torch

from gearshift.decode.autoregressive import AutoregressivePolicy
from gearshift.decode.per_request_mode import PerRequestModePolicy
from gearshift.decode.sampling import SamplingParams
from gearshift.engine.engine import Engine, Request
from gearshift.errors import GearshiftError
from gearshift.model.loader import load_model


@pytest.fixture(scope="module", params=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def loaded(model_dir, request):
    return load_model(str(model_dir("tiny")), quantize="int4", device=request.param)


def _params(n=7):
    return SamplingParams(max_new_tokens=n, ignore_eos=True)


def test_mixed_batch_equals_each_mode_alone(loaded):
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8], [9, 7]]
    modes = ["w4a16", "w4a4", "w4a8", None]  # None: the policy's default
    engine = Engine(loaded, max_batch=3)  # four requests through three slots: one joins mid-run
    policy = PerRequestModePolicy(loaded.model, ["w4a16", "w4a8", "w4a4"], default="w4a8")
    results = engine.generate([Request(p, _params(), mode=m) for p, m in zip(prompts, modes)], policy)
    for p, m, r in zip(prompts, modes, results):
        alone = Engine(loaded, max_batch=1)
        (ref,) = alone.generate([Request(p, _params())], AutoregressivePolicy(loaded.model, m or "w4a8"))
        assert r.token_ids == ref.token_ids, m
    stats = engine.last_stats
    assert all(stats[f"forwards_{m}"] > 0 for m in ("w4a16", "w4a8", "w4a4"))


def test_a_mode_the_policy_does_not_run_is_refused(loaded):
    engine = Engine(loaded, max_batch=1)
    with pytest.raises(GearshiftError, match="w4a4"):
        engine.generate([Request([1, 2], _params(), mode="w4a4")], AutoregressivePolicy(loaded.model, "w4a16"))
    with pytest.raises(GearshiftError, match="w8a8"):
        engine.generate([Request([1, 2], _params(), mode="w8a8")],
                        PerRequestModePolicy(loaded.model, ["w4a16", "w4a8"], default="w4a16"))
    with pytest.raises(GearshiftError, match="default mode"):
        PerRequestModePolicy(loaded.model, ["w4a8"], default="w4a16")
