"""OpenAI API request bodies that the server accepts (pydantic), and the sampling they ask for.

Fields the engine cannot honour (best_of, tools; penalties and logit_bias under QSPEC / GEARBX) are refused with a clear
error rather than ignored, since ignoring them would change what the client gets back. Completions take
echo and logprobs (max_tokens 0 scores the prompt alone, as evaluation harnesses ask), chat takes
logprobs / top_logprobs; neither is streamed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gearshift.decode.sampling import SamplingParams
from gearshift.errors import GearshiftError


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are checked in unsupported(), not rejected blindly

    model: str | None = None
    temperature: float = Field(1.0, ge=0)  # the OpenAI default
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)  # vLLM's extension, 0 = off
    min_p: float = Field(0.0, ge=0, lt=1)  # vLLM's extension
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(1, ge=1, le=64)  # completions per prompt (each its own KV slot; seed + j seeds the j-th)
    ignore_eos: bool = False  # vLLM's extension
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)  # vLLM's extension
    logit_bias: dict[str, float] | None = None  # token id (as a string, as OpenAI sends it) -> bias, -100..100
    stop_token_ids: list[int] | None = None  # vLLM's extension

    def unsupported(self) -> str | None:
        """Why this request cannot be served as asked, or None."""
        extra = self.model_extra or {}
        for name, off in (("logprobs", (None, False, 0)), ("top_logprobs", (None, 0)), ("echo", (None, False)),
                          ("best_of", (None, 1)), ("tools", (None, [])), ("suffix", (None, ""))):
            if name in extra and extra[name] not in off:
                return f"{name} is not supported by gearshift serve"
        return None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self, max_new_tokens: int, copy: int = 0) -> SamplingParams:
        """The `copy`-th of the request's n completions (seed + copy, so they differ and the first is n=1's)."""
        seed = None if self.seed is None else self.seed + copy
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              seed=seed, max_new_tokens=max_new_tokens, stop=self.stops(),
                              stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
                              repetition_penalty=self.repetition_penalty,
                              frequency_penalty=self.frequency_penalty, presence_penalty=self.presence_penalty,
                              logit_bias=self.bias())

    def bias(self) -> dict[int, float] | None:
        try:
            return {int(t): float(b) for t, b in self.logit_bias.items()} if self.logit_bias else None
        except ValueError:
            raise GearshiftError("logit_bias keys must be token ids") from None


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # the OpenAI default; None = up to the context; 0 only with echo
    echo: bool = False  # scoring: the prompt comes back, with its tokens' logprobs where asked
    logprobs: int | None = Field(None, ge=0, le=20)  # how many top alternatives per token


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict]

    def text(self) -> str:
        """Content parts of type "text" joined; other parts (images, audio) are refused by the caller."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.get("text", "") for part in self.content)

    def has_non_text(self) -> bool:
        return not isinstance(self.content, str) and any(part.get("type") != "text" for part in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)  # None = up to the context, as OpenAI's chat endpoint does
    max_completion_tokens: int | None = Field(None, ge=1)  # its newer name; wins where both are given
    logprobs: bool = False  # each reply token's logprob
    top_logprobs: int | None = Field(None, ge=0, le=20)  # and the likeliest alternatives at each, with logprobs
