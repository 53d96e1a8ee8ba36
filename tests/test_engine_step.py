"""benchmarks/engine_step.py (GPU): the graphed decode step that `step_search.py --engine` times."""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
engine_step = pytest.importorskip("engine_step")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def test_engine_step_times_under_the_given_dispatcher_and_restores_the_active_one():
    from gearshift.dispatch import AdaptiveDispatcher, get_dispatcher

    step = engine_step.EngineStep("tiny", "w4a16", False, batch=2, context=16)
    before = get_dispatcher()
    d = AdaptiveDispatcher(None, autoload=False)
    ms = step.ms(d, reps=3, trials=2)
    assert math.isfinite(ms) and ms > 0
    assert get_dispatcher() is before
    # one capture under that dispatcher, replayed from then on; another dispatcher captures anew
    assert step.runner.captures == 1
    step.ms(d, reps=2, trials=1)
    assert step.runner.captures == 1
    step.ms(AdaptiveDispatcher(None, autoload=False), reps=2, trials=1)
    assert step.runner.captures == 2
