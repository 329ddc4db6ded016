"""The names of the public contract (docs/design.md, "Public contract") that users and later
code rely on."""

from __future__ import annotations

import inspect
import types

import pytest
import torch

import attnlab as al


def test_contract_names_exist() -> None:
    for name in (
        "scaled_dot_product_attention",
        "MultiHeadAttention",
        "Transformer",
        "TransformerConfig",
        "GPT",
        "GPTConfig",
        "generate",
        "load_pretrained",
    ):
        assert hasattr(al, name), name
    for name in ("padding_mask", "causal_mask", "combine", "to_additive", "from_key_padding_mask"):
        assert callable(getattr(al.masks, name)), name
    assert callable(al.GPT.from_hf) and callable(al.GPT.to_hf)
    assert callable(al.Encoder.from_hf) and callable(al.Encoder.embed) and callable(al.embed)
    assert al.EncoderConfig(vocab_size=8, d_model=8, n_head=2).family == "bert"
    assert callable(al.MultiHeadAttention.from_torch)
    assert callable(al.inspect.attention_stats) and callable(al.inspect.flops)


def test_sdpa_signature_matches_the_contract() -> None:
    params = inspect.signature(al.scaled_dot_product_attention).parameters
    assert list(params)[:4] == ["query", "key", "value", "mask"]
    for name, default in (
        ("is_causal", False),
        ("dropout_p", 0.0),
        ("scale", None),
        ("backend", "auto"),
        ("need_weights", False),
    ):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default == default


def test_noam_is_a_torch_scheduler_reachable_as_attnlab_training() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = al.training.NoamLR(opt, d_model=512, warmup_steps=4000, factor=1.0)
    assert isinstance(sched, torch.optim.lr_scheduler.LRScheduler)
    # the first optimizer step uses the rate of step 1
    assert opt.param_groups[0]["lr"] == 512**-0.5 * 4000**-1.5


def test_every_public_name_is_what_its_module_defines() -> None:
    # `import attnlab` loads its public names on first use: each is the object, not its module
    from attnlab.decoding.generate import generate

    assert al.generate is generate
    modules = {"errors", "inspect", "training", "masks"}
    for name in al.__all__:
        value = getattr(al, name)
        assert isinstance(value, types.ModuleType) == (name in modules), name
    assert set(al.__all__) <= set(dir(al))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        al.nothing  # noqa: B018
