"""Teacher-forced top-1 agreement of a draft mode with W4A16, and what it means for QSPEC.

Method (the QSPEC paper's Section 2 measurement):
1. the reference continuation of each prompt is greedy W4A16 generation of `n_tokens` tokens
   (stopping after an end-of-sequence token);
2. prompt + continuation go through ONE forward pass per mode (teacher forcing); at every
   continuation position the argmax of the mode's logits is compared with the argmax of
   W4A16's logits from the same pass;
3. agreement alpha = matches / positions, per prompt tag (chat / math / code) and overall.

Expected tokens per QSPEC cycle at draft length gamma, from alpha, with the i.i.d. acceptance
model of Leviathan et al. (2023, eq. 1): E = (1 - alpha^(gamma+1)) / (1 - alpha), counting the
verify pass's own token (so E = gamma + 1 at alpha = 1, 1 at alpha = 0). We also report a
*simulated* figure that walks each continuation's actual match sequence in cycles of gamma
drafts (accept up to the first mismatch, + 1 token from the verify pass); it keeps the
burstiness of real mismatches that the i.i.d. formula ignores. Both are teacher-forced
approximations: a real QSPEC draft conditions on W4A16's (overwritten) KV for accepted tokens.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gearshift.errors import GearshiftError


@dataclass
class PromptItem:
    text: str
    tag: str = "chat"
    ids: list[int] | None = None


def expected_tokens_per_cycle(alpha: float, gamma: int = 3) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha): mean tokens per draft-verify cycle (i.i.d. acceptance)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def simulate_cycles(matches: list[bool], gamma: int = 3) -> tuple[int, int]:
    """(tokens, cycles) when QSPEC walks this match sequence with greedy verification."""
    i, tokens, cycles, n = 0, 0, 0, len(matches)
    while i < n:
        k = 0
        while k < gamma and i + k < n and matches[i + k]:
            k += 1
        step = min(k + 1, n - i)  # accepted drafts + the verify pass's token
        tokens += step
        cycles += 1
        i += step
    return tokens, cycles


# ------------------------------------------------------------------------------------ prompts

def load_prompts(source: str | None = None, tags: list[str] | None = None, limit: int | None = None) -> list[PromptItem]:
    """None: built-in chat/math/code set; 'humaneval[:N]'; a .json/.jsonl file of {"text", "tag"}
    (or "prompt"/"question" keys); any other file: one prompt per line (tag "chat")."""
    from gearshift.data import builtin_prompts, humaneval_prompts

    if source is None or source == "builtin":
        raw = builtin_prompts()
    elif source.startswith("humaneval"):
        n = int(source.split(":", 1)[1]) if ":" in source else None
        raw = humaneval_prompts(n)
    else:
        p = Path(source)
        if not p.exists():
            raise GearshiftError(f"prompt file {p} does not exist")
        text = p.read_text()
        if p.suffix == ".json":
            data = json.loads(text)
            raw = data["prompts"] if isinstance(data, dict) else data
        elif p.suffix == ".jsonl":
            raw = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            raw = [{"text": line, "tag": "chat"} for line in text.splitlines() if line.strip()]
    items = []
    for r in raw:
        if isinstance(r, str):
            r = {"text": r}
        t = r.get("text") or r.get("prompt") or r.get("question")
        if not t:
            raise GearshiftError(f"prompt entry without text: {str(r)[:80]}")
        items.append(PromptItem(t, r.get("tag", "chat")))
    if tags:
        items = [it for it in items if it.tag in tags]
    if limit:
        items = items[:limit]
    if not items:
        raise GearshiftError("no prompts to evaluate")
    return items


def encode_prompt(loaded, text: str) -> list[int]:
    tok = loaded.tokenizer
    if tok is None:
        raise GearshiftError(f"{loaded.source} has no tokenizer; pass token ids")
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tok(text, add_special_tokens=True)["input_ids"]]


# ------------------------------------------------------------------------------------ passes

def _eos(loaded) -> set[int]:
    ids = set(loaded.config.eos_token_id or [])
    if loaded.tokenizer is not None and getattr(loaded.tokenizer, "eos_token_id", None) is not None:
        ids.add(int(loaded.tokenizer.eos_token_id))
    return ids


@torch.inference_mode()
def greedy_continuations(loaded, prompts: list[list[int]], n_tokens: int, mode: str = "w4a16",
                         batch_size: int = 8, progress=None) -> list[list[int]]:
    """Greedy `n_tokens` in `mode` for each prompt (stops after an EOS token, which is kept)."""
    model, eos, out = loaded.model, _eos(loaded), []
    dev = model.device
    for b0 in range(0, len(prompts), batch_size):
        batch = prompts[b0:b0 + batch_size]
        lens = [len(p) for p in batch]
        cache = model.new_cache(len(batch), max(lens) + n_tokens + 1)
        tok = torch.zeros(len(batch), max(lens), dtype=torch.long, device=dev)
        for i, p in enumerate(batch):
            tok[i, :len(p)] = torch.tensor(p)
        logits = model(tok, cache, [0] * len(batch), lens, mode=mode, logits="last")[:, 0]
        gen = [[] for _ in batch]
        done = [False] * len(batch)
        pos = list(lens)
        for step in range(n_tokens):
            nxt = logits.float().argmax(-1).tolist()
            for i in range(len(batch)):
                if not done[i]:
                    gen[i].append(nxt[i])
                    done[i] = nxt[i] in eos or len(gen[i]) >= n_tokens
            if all(done):
                break
            n_new = [0 if d else 1 for d in done]
            step_tok = torch.tensor([[g[-1]] for g in gen], device=dev)
            logits = model(step_tok, cache, pos, n_new, mode=mode, logits="last")[:, 0]
            pos = [p + n for p, n in zip(pos, n_new)]
        out.extend(gen)
        if progress is not None:
            progress.update(len(batch))
    return out


@torch.inference_mode()
def teacher_forced_argmax(loaded, prompts: list[list[int]], conts: list[list[int]], mode: str,
                          batch_size: int = 8, progress=None) -> list[torch.Tensor]:
    """For each sequence, argmax of `mode`'s logits at the positions predicting its continuation."""
    model, out = loaded.model, []
    dev = model.device
    for b0 in range(0, len(prompts), batch_size):
        ps, cs = prompts[b0:b0 + batch_size], conts[b0:b0 + batch_size]
        seqs = [p + c for p, c in zip(ps, cs)]
        lens = [len(s) for s in seqs]
        cache = model.new_cache(len(seqs), max(lens) + 1)
        tok = torch.zeros(len(seqs), max(lens), dtype=torch.long, device=dev)
        for i, s in enumerate(seqs):
            tok[i, :len(s)] = torch.tensor(s)
        logits = model(tok, cache, [0] * len(seqs), lens, mode=mode, logits="all")
        for i, (p, c) in enumerate(zip(ps, cs)):
            out.append(logits[i, len(p) - 1:len(p) - 1 + len(c)].float().argmax(-1).cpu())
        del logits
        if progress is not None:
            progress.update(len(seqs))
    return out


# ------------------------------------------------------------------------------------ harness

@dataclass
class AgreementRow:
    label: str  # e.g. "w4a4 g32+o32"
    mode: str
    options: str
    matches: dict = field(default_factory=dict)  # tag -> (matched, positions)
    sim: dict = field(default_factory=dict)  # tag -> (tokens, cycles)

    def alpha(self, tag: str = "all") -> float:
        m, n = self.matches.get(tag, (0, 0))
        return m / n if n else float("nan")

    def to_dict(self, gamma: int) -> dict:
        d = {"label": self.label, "mode": self.mode, "options": self.options, "gamma": gamma}
        for tag in self.matches:
            a = self.alpha(tag)
            t, c = self.sim[tag]
            d[tag] = {"agreement": round(a, 4), "positions": self.matches[tag][1],
                      "expected_tokens_per_cycle": round(expected_tokens_per_cycle(a, gamma), 3),
                      "simulated_tokens_per_cycle": round(t / c, 3) if c else None}
        return d


class AgreementHarness:
    """Reference continuations and W4A16 teacher-forced argmax computed once; then `evaluate(mode)`
    for as many modes / activation options as wanted (reinstall quantizers in between)."""

    def __init__(self, loaded, prompts: list[PromptItem], n_tokens: int = 64, batch_size: int = 8,
                 progress: bool = True, reference_mode: str = "w4a16"):
        self.loaded, self.items, self.n_tokens, self.batch_size = loaded, prompts, n_tokens, batch_size
        self.progress, self.reference_mode = progress, reference_mode
        self.prompt_ids = [it.ids if it.ids is not None else encode_prompt(loaded, it.text) for it in prompts]
        with self._bar("reference continuations (" + reference_mode + ")") as bar:
            self.conts = greedy_continuations(loaded, self.prompt_ids, n_tokens, reference_mode, batch_size, bar)
        keep = [i for i, c in enumerate(self.conts) if c]
        self.items = [self.items[i] for i in keep]
        self.prompt_ids = [self.prompt_ids[i] for i in keep]
        self.conts = [self.conts[i] for i in keep]
        with self._bar("teacher-forced " + reference_mode) as bar:
            self.ref = teacher_forced_argmax(loaded, self.prompt_ids, self.conts, reference_mode, batch_size, bar)
        # self-consistency: full-sequence argmax vs incremental greedy (differs only at near-ties)
        same = sum(int((r == torch.tensor(c)).sum()) for r, c in zip(self.ref, self.conts))
        self.self_consistency = same / max(1, sum(len(c) for c in self.conts))

    def _bar(self, desc: str):
        from contextlib import nullcontext

        if not self.progress:
            return nullcontext(None)
        from tqdm import tqdm

        return tqdm(total=len(self.prompt_ids) if hasattr(self, "prompt_ids") else len(self.items), desc=desc,
                    file=sys.stderr, disable=None, leave=False)

    @property
    def tags(self) -> list[str]:
        seen = []
        for it in self.items:
            if it.tag not in seen:
                seen.append(it.tag)
        return seen

    def evaluate(self, mode: str, options: str = "default", gamma: int = 3, label: str | None = None) -> AgreementRow:
        with self._bar(f"teacher-forced {mode} {options}") as bar:
            preds = teacher_forced_argmax(self.loaded, self.prompt_ids, self.conts, mode, self.batch_size, bar)
        row = AgreementRow(label or f"{mode} {options}", mode, options)
        per_tag: dict[str, list[list[bool]]] = {}
        for it, p, r in zip(self.items, preds, self.ref):
            per_tag.setdefault(it.tag, []).append((p == r).tolist())
        groups = dict(per_tag)
        if len(per_tag) > 1:
            groups["math+code"] = per_tag.get("math", []) + per_tag.get("code", [])
            if not groups["math+code"]:
                del groups["math+code"]
        groups["all"] = [m for ms in per_tag.values() for m in ms]
        for tag, seqs in groups.items():
            row.matches[tag] = (sum(sum(s) for s in seqs), sum(len(s) for s in seqs))
            toks = cyc = 0
            for s in seqs:
                t, c = simulate_cycles(s, gamma)
                toks, cyc = toks + t, cyc + c
            row.sim[tag] = (toks, cyc)
        return row


def format_table(rows: list[AgreementRow], gamma: int = 3) -> str:
    if not rows:
        return ""
    tags = [t for t in ("chat", "math", "code", "math+code", "all") if t in rows[0].matches]
    tags += [t for t in rows[0].matches if t not in tags]
    head = f"{'mode / activation options':<28}" + "".join(f"{t:>10}" for t in tags) + \
        f"{'E[tok/cyc]':>12}{'sim':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        a = r.alpha("all")
        t, c = r.sim["all"]
        lines.append(f"{r.label:<28}" + "".join(f"{r.alpha(tg):>10.3f}" for tg in tags)
                     + f"{expected_tokens_per_cycle(a, gamma):>12.2f}{(t / c if c else float('nan')):>7.2f}")
    lines.append(f"agreement = teacher-forced top-1 match with w4a16; E[tok/cyc] = (1-a^(g+1))/(1-a) at gamma={gamma} "
                 f"from the 'all' column; sim = simulated greedy QSPEC cycles on the match sequences")
    return "\n".join(lines)
