"""Sampling parameters and the logits -> token step shared by every decode policy.

`filtered_logprobs` is the single definition of the distribution a request samples from
(temperature, top-k, top-p, min-p); QSPEC's rejection rule uses the same function for both
the draft and the verify distributions, so "sampled QSPEC equals verify-mode sampling" is a
statement about this one function.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gearshift.errors import GearshiftError


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    seed: int | None = None
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] | None = None  # None = the model's EOS tokens
    ignore_eos: bool = False
    repetition_penalty: float = 1.0  # > 1 discourages every token of prompt + output (HF / vLLM); 1 = off
    frequency_penalty: float = 0.0  # subtracted per earlier occurrence in the output (OpenAI); 0 = off
    presence_penalty: float = 0.0  # subtracted once for a token the output holds (OpenAI); 0 = off
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, -100..100 (OpenAI)

    def __post_init__(self):
        if self.temperature < 0:
            raise GearshiftError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise GearshiftError("top-p must be in (0, 1]")
        if not 0 <= self.min_p < 1:
            raise GearshiftError("min-p must be in [0, 1)")
        if self.top_k < 0:
            raise GearshiftError("top-k must be >= 0")
        if self.max_new_tokens < 1:
            raise GearshiftError("max-new-tokens must be >= 1")
        if any(not x for x in self.stop):
            raise GearshiftError("stop strings must not be empty")
        if not self.repetition_penalty > 0:
            raise GearshiftError("repetition penalty must be > 0 (1 = off)")
        if not (-2 <= self.frequency_penalty <= 2 and -2 <= self.presence_penalty <= 2):
            raise GearshiftError("frequency and presence penalties must be in [-2, 2] (0 = off)")
        if self.logit_bias and any(not (isinstance(t, int) and t >= 0 and -100 <= b <= 100)
                                   for t, b in self.logit_bias.items()):
            raise GearshiftError("logit_bias maps token ids (>= 0) to biases in [-100, 100]")

    @property
    def penalized(self) -> bool:
        """Whether the logits are changed before sampling (penalties that depend on the tokens before, a logit
        bias), so the device argmax alone will not do."""
        return (self.repetition_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0
                or bool(self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def make_generator(self, device: torch.device | str | None = None) -> torch.Generator | None:
        """The request's random stream (seeded, or from torch's seed), on `device` (default: the CPU): where
        its draws are made (`sample_rows` makes them on the logits' device)."""
        if self.greedy:
            return None
        g = torch.Generator(device=device) if device is not None else torch.Generator()
        g.manual_seed(self.seed if self.seed is not None else torch.seed())
        return g


def filtered_logprobs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Log-probabilities [..., V] after temperature, top-k, top-p and min-p (filtered = -inf)."""
    x = logits.float() / p.temperature
    if p.top_k and p.top_k < x.shape[-1]:
        kth = torch.topk(x, p.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    lp = torch.log_softmax(x, dim=-1)
    if p.min_p > 0:
        cutoff = lp.amax(-1, keepdim=True) + torch.log(torch.tensor(p.min_p))
        lp = lp.masked_fill(lp < cutoff, float("-inf"))
    if p.top_p < 1:
        sorted_lp, order = torch.sort(lp, dim=-1, descending=True)
        cum = sorted_lp.exp().cumsum(-1)
        drop_sorted = (cum - sorted_lp.exp()) >= p.top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        lp = lp.masked_fill(drop, float("-inf"))
    return torch.log_softmax(lp, dim=-1)


def apply_penalties(logits: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    """logits [V] (fp32) with the request's penalties, as vLLM applies them: the repetition penalty divides the
    positive logits (multiplies the negative ones) of every token in prompt + output, the frequency penalty
    subtracts f * count and the presence penalty p once, for each token in the output; then the logit bias.
    On the logits' device."""
    x = logits.clone()
    v, dev = x.shape[-1], x.device
    if p.repetition_penalty != 1:
        seen = torch.tensor(sorted({t for t in (*prompt, *output) if 0 <= t < v}), dtype=torch.long, device=dev)
        if len(seen):
            vals = x[seen]
            x[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if output and (p.frequency_penalty or p.presence_penalty):
        counts = torch.bincount(torch.tensor([t for t in output if 0 <= t < v], dtype=torch.long, device=dev),
                                minlength=v)[:v].float()
        x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
    bias = {t: b for t, b in (p.logit_bias or {}).items() if t < v}
    if bias:
        x[torch.tensor(list(bias), device=dev)] += torch.tensor(list(bias.values()), dtype=x.dtype, device=dev)
    return x


def filtered_logprobs_rows(z: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """`filtered_logprobs` of each row of z [R, ..., V] under its own params, on z's device: one call per set of
    temperature / top-k / top-p / min-p (a server's rows mostly share one), not one per row."""
    groups: dict[tuple, list[int]] = {}
    for j, p in enumerate(params):
        groups.setdefault((p.temperature, p.top_k, p.top_p, p.min_p), []).append(j)
    if len(groups) == 1:
        return filtered_logprobs(z, params[0])
    out = torch.empty_like(z, dtype=torch.float32)
    for js in groups.values():
        put_rows(out, js, filtered_logprobs(take_rows(z, js), params[js[0]]))
    return out


def device_index(values: list[int], device: torch.device) -> torch.Tensor:
    """values as an index tensor on `device` without a stream sync: `torch.tensor(values, device=cuda)` copies
    from pageable memory and waits for the stream, i.e. for a decode step launched ahead."""
    t = torch.tensor(values, dtype=torch.long)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _row_index(rows: list[int], device: torch.device) -> slice | torch.Tensor:
    """A slice where the rows are consecutive (the common case: every row of a batch sampled), else an index
    tensor (`device_index`)."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return device_index(rows, device)


def take_rows(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """t[rows]: a view where the rows are consecutive, else gathered."""
    return t[_row_index(rows, t.device)]


def put_rows(t: torch.Tensor, rows: list[int], values: torch.Tensor) -> None:
    """t[rows] = values, as `take_rows` reads them."""
    t[_row_index(rows, t.device)] = values


def draw_rows(weights: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row of weights [R, V] (probabilities, or any nonnegative multiple of them), each from its own
    generator, so a row's draw depends on its own seed only, not on the rows batched with it. The draw is
    torch.multinomial's for one sample (argmax of w / Exp(1) noise, the noise from the row's generator: the same
    tokens, checked in tests/test_sampling.py) without its validity check, which reads a flag back to the host and
    so synced the stream once per row. A generator on another device fills its row's noise there."""
    noise = torch.empty_like(weights)
    for j, g in enumerate(generators):
        if g.device == weights.device:
            noise[j].exponential_(1, generator=g)
        else:
            noise[j].copy_(torch.empty(weights.shape[-1], dtype=weights.dtype, device=g.device).exponential_(
                1, generator=g), non_blocking=True)
    return (weights / noise).argmax(-1)


def sample_rows(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator | None], histories: list[tuple[list[int], list[int]]] | None = None
                ) -> list[int]:
    """One token per row of logits [B, V]; greedy rows take the first argmax. histories: each row's (prompt,
    output) tokens, which rows with penalties need.

    The filters run on the logits' device, batched over the rows that share them (`filtered_logprobs`, one call
    per set of temperature / top-k / top-p / min-p); each sampled row is then drawn as torch.multinomial draws, from
    its own generator (`SamplingParams.make_generator` on the policy's `sample_device`), and the tokens come back in
    one copy. The earlier form copied the rows to the host and filtered them one by one there: 40 ms per step
    for 16 rows of a 128k vocabulary on two CPU cores, 211 ms with top-p's sort (stop 58, timed before the
    change), against a 3 ms decode step of an 8B model. On the CPU the draws are the earlier form's, token for
    token. `benchmarks/sampling.py` times this against the same call on rows copied to the host."""
    return sample_rows_device(logits, params, generators, histories).tolist()


def sample_rows_device(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
                       histories: list[tuple[list[int], list[int]]] | None = None) -> torch.Tensor:
    """`sample_rows`' tokens as a tensor [B] on the logits' device, queued without a sync (penalties aside:
    they build their token sets on the host), so a decode step can be fed them before they are read back."""
    out = logits.argmax(-1)
    rows = [i for i, p in enumerate(params) if not p.greedy or p.penalized]
    if not rows:
        return out
    z = take_rows(logits, rows).float()
    for j, i in enumerate(rows):
        if params[i].penalized:
            if histories is None:
                raise GearshiftError("penalties need each row's prompt and output tokens")
            z[j] = apply_penalties(z[j], params[i], *histories[i])
    picked = z.argmax(-1)  # penalized greedy rows
    js = [j for j, i in enumerate(rows) if not params[i].greedy]
    if js:
        lp = filtered_logprobs_rows(take_rows(z, js), [params[rows[j]] for j in js])
        put_rows(picked, js, draw_rows(lp.exp(), [generators[rows[j]] for j in js]))
    put_rows(out, rows, picked)
    return out
