"""The memory estimates of a model and a training step against what PyTorch really allocates."""

from __future__ import annotations

import pytest
import torch

import attnlab as al
from attnlab.inspect.footprint import training_footprint

CONFIGS = [
    (al.GPTConfig(vocab_size=65, n_positions=64, n_embd=64, n_layer=2, n_head=4), 64, 6),
    (al.GPTConfig(vocab_size=300, n_positions=32, n_embd=32, n_layer=2, n_head=2, bias=False), 32, 4),
    (
        al.GPTConfig(vocab_size=65, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                     attention=al.PerformerSpec(num_features=40)),
        64, 4,
    ),
    (
        al.TransformerConfig(src_vocab_size=50, tgt_vocab_size=60, d_model=32, num_heads=4,
                             num_encoder_layers=2, num_decoder_layers=1, d_ff=64, max_len=64),
        20, 8,
    ),
    (
        al.TransformerConfig(src_vocab_size=50, tgt_vocab_size=60, d_model=32, num_heads=4,
                             num_encoder_layers=1, num_decoder_layers=1, d_ff=64, max_len=64,
                             attention=al.LinformerSpec(k=8)),
        20, 8,
    ),
]  # fmt: skip


def _model(config):
    return al.GPT(config) if isinstance(config, al.GPTConfig) else al.Transformer(config)


def _loss(model, config, seq_len, batch):
    if isinstance(config, al.GPTConfig):
        ids = torch.randint(0, config.vocab_size, (batch, seq_len))
        logits = model(ids).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
    src = torch.randint(4, config.src_vocab_size, (batch, seq_len))
    tgt = torch.randint(4, config.tgt_vocab_size, (batch, seq_len))
    return model(src, tgt).logits.logsumexp(-1).mean()


@pytest.mark.parametrize(("config", "seq_len", "batch"), CONFIGS)
def test_parameters_and_training_state_are_exact(config, seq_len, batch) -> None:
    model = _model(config)
    fp = training_footprint(config, seq_len, batch)
    params = list(model.parameters())
    assert fp.parameters == sum(p.numel() for p in params)
    assert fp.weights == sum(p.numel() * p.element_size() for p in params)
    # one AdamW step: gradients and the two moments are allocated
    opt = torch.optim.AdamW(params)
    _loss(model, config, seq_len, batch).backward()
    opt.step()
    held = fp.weights + sum(p.grad.nbytes for p in params if p.grad is not None)
    held += sum(t.nbytes for s in opt.state.values() for t in s.values() if t.dim() > 0)
    assert fp.training_state == held


@pytest.mark.parametrize(("config", "seq_len", "batch"), CONFIGS)
def test_activations_are_a_lower_bound_of_what_a_step_holds(config, seq_len, batch) -> None:
    model = _model(config)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.nn.Parameter):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _loss(model, config, seq_len, batch)
    vocab = config.vocab_size if isinstance(config, al.GPTConfig) else config.tgt_vocab_size
    logits_grad = 4 * batch * seq_len * vocab  # allocated as the backward pass starts
    estimate = training_footprint(config, seq_len, batch).activations
    held = sum(storages.values()) + logits_grad
    assert 0.3 * held < estimate <= held


def test_footprint_grows_with_the_sizes_without_allocating() -> None:
    config = al.GPTConfig(vocab_size=65, n_positions=64, n_embd=1_000_000, n_layer=4, n_head=4)
    fp = training_footprint(config, 64, 10**9)  # arithmetic only: nothing of that size exists
    assert fp.training_state == 4 * fp.weights > 10**14
    assert fp.activations > 10**18
