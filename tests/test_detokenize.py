"""Incremental detokenization (engine/detokenize.py): the streamed text equals decoding everything at
once, for a byte-level BPE tokenizer (GPT-2 / Llama-3 / SmolLM2 style) and a SentencePiece-style one
(Metaspace, byte fallback, a decoder that strips the leading space: Llama-2 / Mistral style), fed one
to four tokens at a time, with multi-byte characters split across tokens, and after a trim."""

import random

import pytest

from gearshift.engine.detokenize import IncrementalDetokenizer

TEXT = ("Hello, wörld! 你好，世界 🙂👍🏽 — naïve café. def f(x):\n    return x ** 2  # ok\n\n"
        "😀 end ünïcödé ✓ ∑ √ ¿qué? Ελληνικά עברית")


def _byte_level():
    from gearshift.model.tiny import build_tokenizer

    return build_tokenizer(600)


def _sentencepiece_style():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"] + bytes_)
    tok.train_from_iterator([TEXT.replace("ö", "o")] * 20 + ["the quick brown fox jumps over the lazy dog"] * 20,
                            trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("make", [_byte_level, _sentencepiece_style], ids=["byte-level", "sentencepiece"])
def test_streamed_text_is_the_whole_decode(make):
    tok = make()
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == TEXT
    rng = random.Random(0)
    vocab = len(tok)
    for trial in range(60):
        seq = ids if trial == 0 else [rng.choice(ids) if rng.random() < 0.8 else rng.randrange(vocab)
                                      for _ in range(50)]
        d = IncrementalDetokenizer(tok)
        streamed, i = "", 0
        while i < len(seq):
            i = min(len(seq), i + rng.randint(1, 4))
            streamed += d.update(seq[:i])
            assert streamed == d.text
            assert tok.decode(seq[:i], skip_special_tokens=True).startswith(d.text)
        whole = tok.decode(seq, skip_special_tokens=True)
        if not whole.endswith("\ufffd"):  # (a trailing incomplete character is held back)
            assert d.text == whole


def test_trimmed_ids_start_over():
    tok = _byte_level()
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    d = IncrementalDetokenizer(tok)
    d.update(ids[:30])
    d.update(ids[:20])  # a stop trimmed the output
    assert d.text == tok.decode(ids[:20]) or tok.decode(ids[:20]).startswith(d.text)
    d.update(ids)
    assert d.text == TEXT


def test_random_model_tokenizer_decodes_every_id_to_visible_text():
    """A real-shape random model samples ids across its whole vocabulary; ids past what the built-in corpus
    trains are filler words, so each decodes to text (a stream shows every token) and encoding is unchanged."""
    from gearshift.model.tiny import build_tokenizer

    small, big = build_tokenizer(1024), build_tokenizer(4096)
    assert len(big) == 4096
    text = "The quick brown fox jumps over the lazy dog."
    assert big(text)["input_ids"] == small(text)["input_ids"]
    special = set(big.all_special_ids)
    assert all(big.decode([i]) for i in range(0, 4096, 7) if i not in special)
    words = [big.decode([i]) for i in range(1024, 4096)]
    assert len(set(words)) == len(words) and all(w.startswith(" ") for w in words)
