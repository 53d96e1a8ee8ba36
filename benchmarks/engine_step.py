"""The engine's graphed decode step of a random-weight model at real shapes, as a timing target for
map searches (GPU): `gearshift.model.step_timer.DecodeStepTimer` on the model `e2e.py` builds.

`e2e_ab.py` times whole generations: right for a verdict, too noisy (2-3% between rounds) to rank
tile choices that differ by 1%. This times back-to-back replays of the captured decode step.
"""
from __future__ import annotations

from gearshift.model.step_timer import DecodeStepTimer


class EngineStep(DecodeStepTimer):
    """DecodeStepTimer on `e2e.model_for`'s random-weight model of a preset (built once per `models`)."""

    def __init__(self, preset: str, mode: str, int4_prog: bool, batch: int, context: int = 512, seed: int = 0,
                 models: dict | None = None):
        from e2e import model_for

        super().__init__(model_for({} if models is None else models, preset, mode, int4_prog), mode, batch,
                         context, seed)
