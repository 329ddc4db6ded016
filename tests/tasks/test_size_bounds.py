"""Sizes too large for the machine, and counts no run needs, are refused when the options are
built or the model is set up: one ``ArgumentError`` naming the option, before any allocation."""

from __future__ import annotations

import time

import pytest
import torch

import attnlab as al
from attnlab import tasks
from attnlab.errors import ArgumentError
from attnlab.nn.performer import PerformerAttention
from attnlab.tasks.train_options import CAPS, AlgorithmicOptions, LMOptions, TranslateOptions

TEXT = "to be, or not to be, that is the question:\n" * 40


@pytest.mark.parametrize(
    ("cls", "field"),
    [(LMOptions, "eval_iters"), (LMOptions, "n_layer"), (LMOptions, "seed"),
     (TranslateOptions, "layers"), (TranslateOptions, "beams"), (AlgorithmicOptions, "layers")],
)  # fmt: skip
def test_counts_are_capped(tmp_path, cls, field) -> None:
    cap = CAPS[field][0]
    required = {"data": "x"} if cls is LMOptions else {}
    cls(out=tmp_path, steps=1, **required, **{field: cap})
    flag = "--" + field.replace("_", "-")
    with pytest.raises(ArgumentError, match=f"^{flag} must be at most {cap} "):
        cls(out=tmp_path, steps=1, **required, **{field: cap + 1})


@pytest.mark.parametrize(
    ("overrides", "named"),
    [({"batch_size": 10**9}, "--batch-size 1000000000"),
     ({"n_embd": 10**6}, "--n-embd 1000000"),
     ({"attention": al.PerformerSpec(num_features=10**9)}, "--num-features 1000000000")],
)  # fmt: skip
def test_lm_sizes_beyond_the_machine(tmp_path, overrides, named) -> None:
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    start = time.perf_counter()
    with pytest.raises(ArgumentError, match=f"^{named} .*needs about .* machine has "):
        tasks.train("lm", out=tmp_path / "run", steps=2, warmup=1, data=str(data), progress=False,
                    **overrides)  # fmt: skip
    assert time.perf_counter() - start < 10
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_translate_bpe_vocabulary_beyond_the_machine(tmp_path) -> None:
    src, tgt = tmp_path / "a.txt", tmp_path / "b.txt"
    src.write_text("a b c\n" * 5, encoding="utf-8")
    tgt.write_text("x y z\n" * 5, encoding="utf-8")
    with pytest.raises(ArgumentError, match=r"^--tgt-vocab 1000000000000 needs about .* BPE"):
        tasks.train("translate", out=tmp_path / "run", steps=2, warmup=1, src=str(src),
                    tgt=str(tgt), tgt_vocab=10**12, progress=False)  # fmt: skip


def test_algorithmic_batch_beyond_the_machine(tmp_path) -> None:
    with pytest.raises(ArgumentError, match=r"^--batch-size 1000000000 .*needs about"):
        tasks.train("reverse", out=tmp_path / "run", steps=2, warmup=1, batch_size=10**9,
                    progress=False)  # fmt: skip


def test_performer_features_beyond_the_machine_are_refused_before_drawing() -> None:
    start = time.perf_counter()
    with pytest.raises(ArgumentError, match=r"^num_features 1000000000000 needs about"):
        PerformerAttention(64, 4, num_features=10**12)
    assert time.perf_counter() - start < 1


def test_generate_refuses_beams_whose_cache_exceeds_the_machine() -> None:
    config = al.GPTConfig(vocab_size=65, n_positions=64, n_embd=128, n_layer=4, n_head=4)
    model = al.GPT(config)
    prompt = torch.randint(0, 65, (1, 5))
    # the estimate is the cache the model makes, exactly
    cache = model.new_cache(3, 5 + 50)
    meta = model.new_cache(1, 5 + 50, device="meta", dtype=torch.float32)
    assert cache.nbytes() == 3 * meta.nbytes()
    start = time.perf_counter()
    with pytest.raises(ArgumentError, match=r"^num_beams 1000000 needs about .*KV cache"):
        al.generate(model, prompt, max_new_tokens=50, strategy="beam", num_beams=10**6)
    assert time.perf_counter() - start < 1
    seq2seq = al.Transformer(
        al.TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=64, num_heads=4,
                             num_encoder_layers=1, num_decoder_layers=2, d_ff=64, max_len=128)
    )  # fmt: skip
    with pytest.raises(ArgumentError, match=r"^num_beams 10000000 needs about"):
        al.generate(seq2seq, prompt % 20, max_new_tokens=100, strategy="beam", num_beams=10**7)
    assert al.generate(model, prompt, max_new_tokens=3, strategy="beam", num_beams=3).shape == (
        1,
        8,
    )
