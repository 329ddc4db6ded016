"""Scoring decoded outputs, and decoding with a model that knows the answer."""

from __future__ import annotations

import pytest
import torch

from attnlab.models.config import TransformerConfig
from attnlab.models.transformer import Transformer
from attnlab.tasks.seq2seq import (
    decode_sources,
    exact_match_accuracy,
    strip_special,
)
from attnlab.tasks.translate import corpus_bleu


def test_strip_special() -> None:
    assert strip_special([2, 5, 6, 3, 7, 0], bos_id=2, eos_id=3, pad_id=0) == [5, 6]
    assert strip_special([2, 5, 0, 0], bos_id=2, eos_id=3, pad_id=0) == [5]
    assert strip_special([5, 2], bos_id=2, eos_id=3, pad_id=0) == [5, 2]  # bos only first


def test_exact_match_accuracy() -> None:
    assert exact_match_accuracy([[1, 2], [3], []], [[1, 2], [3, 4], []]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="same count, got 1 and 2"):
        exact_match_accuracy([[1]], [[1], [2]])


def test_corpus_bleu_perfect_and_empty() -> None:
    assert corpus_bleu(["the cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(
        100.0
    )
    assert corpus_bleu(["x"], ["the cat sat on the mat"]) == pytest.approx(0.0)


class _Echo(Transformer):
    """Logits that always prefer the source token at the same position, then <eos>."""

    def encode(self, src, src_mask=None):  # type: ignore[override]
        self._src = [[t for t in row if t != self.config.pad_id] for row in src.tolist()]
        return super().encode(src, src_mask)

    def decode(self, tgt, memory, *, src_mask=None, tgt_mask=None, cache=None):  # type: ignore[override]
        out = super().decode(tgt, memory, src_mask=src_mask, tgt_mask=tgt_mask, cache=cache)
        past = 0 if cache is None else cache.length - tgt.shape[1]
        logits = torch.full_like(out.logits, -10.0)
        for t in range(tgt.shape[1]):
            pos = past + t
            for b in range(tgt.shape[0]):
                row = self._src[b]
                token = row[pos] if pos < len(row) else self.config.eos_id
                logits[b, t, token] = 10.0
        out.logits = logits
        return out


def test_decode_sources_returns_the_tokens_without_specials() -> None:
    cfg = TransformerConfig(src_vocab_size=12, tgt_vocab_size=12, d_model=16, num_heads=2,
                            num_encoder_layers=1, num_decoder_layers=1, d_ff=16, max_len=32,
                            pad_id=0, bos_id=2, eos_id=3)  # fmt: skip
    model = _Echo(cfg)
    sources = [[5, 6, 7], [8], [9, 10]]
    assert decode_sources(model, sources, max_new_tokens=6) == sources
    # batched in pieces, same result
    assert decode_sources(model, sources, max_new_tokens=6, batch_size=2) == sources
