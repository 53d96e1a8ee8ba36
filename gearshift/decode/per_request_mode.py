"""Autoregressive decoding where each request names its own precision mode (w4a16, w4a8, w4a4, ...).

One weight store serves every mode, so a server can let each client choose speed or fidelity per
request. A step runs one forward per mode present in the batch, each over the rows of its own
requests (the other rows have no new tokens: their K/V writes go to each slot's scratch position, so
they are left alone). A request's tokens are then exactly those of a single-mode run of its mode;
a batch that mixes modes costs one forward per mode each step.
"""

from __future__ import annotations

from gearshift.decode.autoregressive import AutoregressivePolicy
from gearshift.decode.base import DecodePolicy, Sequence
from gearshift.errors import GearshiftError


class PerRequestModePolicy(DecodePolicy):
    name = "ar"
    reuses_prefix = True  # the engine matches a slot's mode as well as its tokens
    penalties = True  # each mode's rows run an AutoregressivePolicy
    narrow_decode = True  # (so do its decode widths: `decode_widths` for a warm-up)
    samples_on_device = True

    def __init__(self, model, modes: list[str], default: str):
        if default not in modes:
            raise GearshiftError(f"the default mode {default!r} is not among the modes served ({', '.join(modes)})")
        super().__init__(model, default)
        self.by_mode = {m: AutoregressivePolicy(model, m) for m in dict.fromkeys(modes)}

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(self.by_mode)

    def mode_of(self, s: Sequence) -> str:
        mode = s.mode or self.mode
        if mode not in self.by_mode:
            raise GearshiftError(f"mode {mode!r} is not served here (modes: {', '.join(self.modes)})")
        return mode

    def _groups(self, seqs: list[Sequence]) -> dict[str, list[Sequence]]:
        groups: dict[str, list[Sequence]] = {}
        for s in seqs:
            groups.setdefault(self.mode_of(s), []).append(s)
        return groups

    def bind(self, cache) -> None:
        super().bind(cache)
        for p in self.by_mode.values():
            p.bind(cache)

    def prefill(self, seqs: list[Sequence], sample) -> None:
        for mode, group in self._groups(seqs).items():
            self.by_mode[mode].prefill(group, sample)

    def step(self, seqs: list[Sequence], sample) -> None:
        for mode, group in self._groups(seqs).items():
            self.by_mode[mode].step(group, sample)

    def forget(self, s: Sequence) -> None:
        for p in self.by_mode.values():
            p.forget(s)

    def finish(self) -> None:
        for p in self.by_mode.values():
            p.finish()

    def stats(self) -> dict:
        out: dict = {}
        for mode, p in self.by_mode.items():
            for k, v in p.stats().items():
                out[k] = out.get(k, 0) + v
            out[f"forwards_{mode}"] = p.counters.get("forwards", 0)
        return out
