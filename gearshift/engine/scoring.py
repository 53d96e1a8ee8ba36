"""Log-probabilities of a prompt's tokens in one precision mode: what evaluation harnesses ask a server
for (lm-eval's loglikelihood tasks send the context and continuation with echo and logprobs).

One eager forward over the whole prompt, in a KV cache of its own, so it can run between the steps
of a running batch without touching it. Position p's log-probability is that of token p given tokens
0..p-1; the first token has none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PromptScores:
    token_logprobs: list[float | None]  # per prompt token (None for the first)
    top_logprobs: list[list[tuple[int, float]] | None]  # per prompt token, the `top` likeliest ids there
    next_token: int  # the greedy continuation of the prompt


@torch.inference_mode()
def eager_logits(model, ids: list[int], mode: str, which: str = "all") -> torch.Tensor:
    """The logits of one forward over `ids` in mode `mode`, in a KV cache of its own ([T, V] for "all", [1, V]
    for "last"). Eagerly: a graph captured for this throwaway cache would never be replayed."""
    cache = model.new_cache(1, len(ids) + 1)
    tokens = torch.tensor([ids], dtype=torch.long, device=model.device)
    return model.forward_lists(tokens, cache, [0], [len(ids)], len(ids), mode, which)[0]


@torch.inference_mode()
def score_prompt(model, ids: list[int], mode: str, top: int = 0) -> PromptScores:
    logits = eager_logits(model, ids, mode)
    lp = torch.log_softmax(logits.float(), dim=-1)  # [T, V]: row p predicts token p + 1
    target = torch.tensor(ids[1:], device=lp.device)
    picked = lp[:-1].gather(1, target.unsqueeze(1)).squeeze(1).tolist() if len(ids) > 1 else []
    tops: list[list[tuple[int, float]]] = [[] for _ in ids]
    if top > 0:
        values, indices = lp.topk(min(top, lp.shape[-1]), dim=-1)
        tops = [list(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
    return PromptScores([None] + picked, [None] + tops[:-1], int(lp[-1].argmax()))
