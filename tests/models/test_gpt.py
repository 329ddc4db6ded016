"""attnlab.GPT: the GPT-2 decoder (shapes, init, cache, padding, positions, checkpointing, errors)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnlab as al
from attnlab.models.config import config_from_dict, config_to_dict
from attnlab.models.gpt import GPTSelfAttention

TINY = {"vocab_size": 61, "n_positions": 24, "n_embd": 32, "n_layer": 2, "n_head": 4}
VARIANTS = {
    "learned": {},
    "rope": {"positions": "rope"},
    "alibi": {"positions": "alibi"},
    "gqa": {"num_kv_heads": 2},
    "mqa-rope": {"num_kv_heads": 1, "positions": "rope"},
}


def tiny(**overrides: object) -> al.GPT:
    return al.GPT(al.GPTConfig(**{**TINY, **overrides})).eval()  # type: ignore[arg-type]


def left_padded(batch: int = 3, t: int = 9, vocab: int = 61) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (batch, t))
    mask = torch.ones(batch, t, dtype=torch.long)
    mask[0, :4] = 0
    mask[1, :1] = 0
    return ids, mask


# -- config --


def test_config_defaults_are_gpt2_small() -> None:
    cfg = al.GPTConfig()
    assert (cfg.vocab_size, cfg.n_positions, cfg.n_embd, cfg.n_layer, cfg.n_head) == (
        50257,
        1024,
        768,
        12,
        12,
    )
    assert cfg.layer_norm_epsilon == 1e-5 and cfg.positions == "learned" and cfg.bias
    assert config_from_dict(al.GPTConfig, config_to_dict(cfg)) == cfg
    with pytest.raises(dataclasses_frozen_error()):
        cfg.n_layer = 3  # type: ignore[misc]


def dataclasses_frozen_error() -> type[Exception]:
    import dataclasses

    return dataclasses.FrozenInstanceError


@pytest.mark.parametrize(
    ("overrides", "error", "words"),
    [
        ({"n_embd": 30, "n_head": 4}, ValueError, "n_embd = 30 must be divisible by n_head = 4"),
        ({"num_kv_heads": 3}, ValueError, "multiple of num_kv_heads = 3"),
        ({"positions": "sinusoidal"}, ValueError, "positions must be one of"),
        ({"dropout": 1.5}, ValueError, "dropout must be in [0, 1)"),
        ({"vocab_size": 0}, ValueError, "vocab_size must be a positive int"),
        ({"n_layer": 2.0}, TypeError, "n_layer must be an int"),
        ({"backend": "flash"}, ValueError, "backend must be one of"),
        ({"gradient_checkpointing": 1}, TypeError, "gradient_checkpointing must be a bool"),
        ({"layer_norm_epsilon": -1.0}, ValueError, "layer_norm_epsilon must be a positive float"),
        ({"n_embd": 36, "n_head": 4, "positions": "rope"}, ValueError, "even head dimension"),
    ],
)
def test_config_validation(overrides: dict, error: type[Exception], words: str) -> None:
    with pytest.raises(
        error, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        al.GPTConfig(**{**TINY, **overrides})


# -- structure and init --


def test_gpt2_parameter_names_and_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # shapes only: a meta-device model, without the (slow on meta) random init
    monkeypatch.setattr(torch.nn.init, "normal_", lambda t, *args, **kwargs: t)
    with torch.device("meta"):
        model = al.GPT(al.GPTConfig())
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    expected_block = {
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias",
    }  # fmt: skip
    expected = {f"transformer.h.{i}.{n}" for i in range(12) for n in expected_block}
    expected |= {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight"}
    expected |= {"transformer.ln_f.bias", "lm_head.weight"}
    assert names == expected
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.num_parameters() == 124_439_808  # GPT-2 small
    assert isinstance(model.transformer.h[0].attn, al.MultiHeadAttention)
    assert model.transformer.h[0].attn.c_attn.weight.shape == (3 * 768, 768)


def test_init_std_and_residual_scaling() -> None:
    model = al.GPT(al.GPTConfig(vocab_size=500, n_positions=256, n_embd=256, n_layer=8, n_head=4))
    block = model.transformer.h[3]
    scaled = 0.02 / math.sqrt(2 * 8)
    for w, std in [
        (block.attn.c_attn.weight, 0.02),
        (block.mlp.c_fc.weight, 0.02),
        (model.transformer.wte.weight, 0.02),
        (model.transformer.wpe.weight, 0.02),
        (block.attn.c_proj.weight, scaled),
        (block.mlp.c_proj.weight, scaled),
    ]:
        assert abs(w.std().item() - std) < 0.1 * std
    assert torch.all(block.attn.c_attn.bias == 0) and torch.all(block.ln_1.weight == 1)


def test_gqa_projection_shape() -> None:
    model = tiny(num_kv_heads=2)
    assert model.transformer.h[0].attn.c_attn.weight.shape == (32 + 2 * 2 * 8, 32)
    assert model.new_cache(2, 5).layers[0].k.shape == (2, 2, 5, 8)


# -- forward --


def test_forward_shapes_and_loss_matches_shifted_cross_entropy() -> None:
    model = tiny()
    ids = torch.randint(0, 61, (2, 7))
    labels = ids.clone()
    labels[0, 3] = -100
    out = model(ids, labels=labels)
    assert isinstance(out, al.models.outputs.CausalLMOutput)
    assert out.logits.shape == (2, 7, 61) and out.cache is None
    logits = out.logits.double()
    terms = [
        -F.log_softmax(logits[b, t], -1)[labels[b, t + 1]]
        for b in range(2)
        for t in range(6)
        if labels[b, t + 1] != -100
    ]
    assert len(terms) == 11
    torch.testing.assert_close(out.loss.double(), torch.stack(terms).mean(), atol=1e-6, rtol=1e-6)
    assert model(ids).loss is None


def test_causal_future_tokens_do_not_change_the_past() -> None:
    model = tiny()
    ids = torch.randint(0, 61, (1, 10))
    other = ids.clone()
    other[0, 6:] = (other[0, 6:] + 1) % 61
    a, b = model(ids).logits, model(other).logits
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_all_ones_mask_equals_no_mask() -> None:
    model = tiny()
    ids = torch.randint(0, 61, (2, 6))
    torch.testing.assert_close(model(ids, torch.ones_like(ids)).logits, model(ids).logits)
    torch.testing.assert_close(
        model(ids, torch.ones_like(ids, dtype=torch.bool)).logits, model(ids).logits
    )


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_left_padded_rows_equal_rows_alone(variant: str) -> None:
    model = tiny(**VARIANTS[variant]).double()
    ids, mask = left_padded()
    batched = model(ids, mask).logits
    for b in range(ids.shape[0]):
        real = mask[b].bool()
        alone = model(ids[b : b + 1, real]).logits[0]
        torch.testing.assert_close(batched[b, real], alone, atol=1e-10, rtol=1e-10)
        assert torch.isfinite(batched[b]).all()  # padded query rows are zeros, never NaN


def test_position_ids_come_from_the_mask() -> None:
    model = tiny()
    ids, mask = left_padded()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    torch.testing.assert_close(model(ids, mask).logits, model(ids, mask, position_ids=pos).logits)
    shifted = model(ids, mask, position_ids=pos + 1).logits
    assert not torch.allclose(shifted[2], model(ids, mask).logits[2])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_decoding_equals_full_forward(variant: str) -> None:
    model = tiny(**VARIANTS[variant]).double()
    ids, mask = left_padded(t=10)
    full = model(ids, mask).logits
    cache = model.new_cache(3, 12, dtype=torch.float64)
    steps = [model(ids[:, :5], mask[:, :5], cache=cache).logits]
    for i in range(5, 10):
        out = model(ids[:, i : i + 1], mask[:, : i + 1], cache=cache)
        assert out.cache is cache and cache.length == i + 1
        steps.append(out.logits)
    got = torch.cat(steps, dim=1)
    real = mask.bool()
    torch.testing.assert_close(got[real], full[real], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("variant", ["learned", "alibi", "rope"])
def test_cached_decoding_without_mask(variant: str) -> None:
    model = tiny(**VARIANTS[variant]).double()
    ids = torch.randint(0, 61, (2, 8))
    full = model(ids).logits
    cache = model.new_cache(2, 8)
    assert cache.layers[0].k.dtype == torch.float64  # the parameters' dtype by default
    steps = [model(ids[:, :3], cache=cache).logits] + [
        model(ids[:, i : i + 1], cache=cache).logits for i in range(3, 8)
    ]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-10, rtol=1e-10)


def test_rope_and_alibi_are_relative() -> None:
    """Rotary and ALiBi scores depend only on distances: shifting every position changes nothing."""
    for variant in ("rope", "alibi"):
        model = tiny(**VARIANTS[variant]).double()
        ids = torch.randint(0, 61, (1, 6))
        base = model(ids).logits
        shifted = model(ids, position_ids=torch.arange(7, 13)).logits
        torch.testing.assert_close(shifted, base, atol=1e-10, rtol=1e-10)
    learned = tiny().double()
    ids = torch.randint(0, 61, (1, 6))
    assert not torch.allclose(
        learned(ids, position_ids=torch.arange(7, 13)).logits, learned(ids).logits
    )


def test_alibi_matches_explicit_attention() -> None:
    """One ALiBi layer against the equation softmax(QKᵀ/√d − m_h (i − j) + causal) V, in float64."""
    model = al.GPT(
        al.GPTConfig(vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2, positions="alibi")
    )
    model = model.double().eval()
    attn = model.transformer.h[0].attn
    seen: dict[str, torch.Tensor] = {}
    attn.hook_weights.register_forward_hook(lambda m, a, out: seen.setdefault("w", out))
    attn.hook_q.register_forward_hook(lambda m, a, out: seen.setdefault("q", out))
    attn.hook_k.register_forward_hook(lambda m, a, out: seen.setdefault("k", out))
    model(torch.randint(0, 11, (1, 5)))
    q, k = seen["q"], seen["k"]
    i = torch.arange(5)[:, None]
    j = torch.arange(5)[None, :]
    slopes = torch.tensor([2.0**-4, 2.0**-8], dtype=torch.float64)[:, None, None]  # 2 heads
    scores = q @ k.transpose(-1, -2) / math.sqrt(4) - slopes * (i - j)
    scores = scores.masked_fill(j > i, float("-inf"))
    torch.testing.assert_close(seen["w"], scores.softmax(-1), atol=1e-12, rtol=1e-12)


def test_hooks_capture_without_changing_forward() -> None:
    model = tiny()
    ids = torch.randint(0, 61, (2, 6))
    before = model(ids).logits
    captured: list[torch.Tensor] = []
    handles = [
        model.transformer.h[1].attn.hook_weights.register_forward_hook(
            lambda m, a, o: captured.append(o)
        ),
        model.transformer.h[0].hook_resid_post.register_forward_hook(
            lambda m, a, o: captured.append(o)
        ),
    ]
    after = model(ids).logits
    for h in handles:
        h.remove()
    torch.testing.assert_close(after, before)
    weights, resid = captured[1], captured[0]
    assert weights.shape == (2, 4, 6, 6) and resid.shape == (2, 6, 32)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))
    assert torch.all(weights.triu(1) == 0)


def test_attention_is_shared_multihead_subclass() -> None:
    attn = tiny().transformer.h[0].attn
    assert isinstance(attn, GPTSelfAttention)
    assert not hasattr(attn, "in_proj_weight") and not hasattr(attn, "out_proj")


# -- training --


def test_dropout_only_in_training() -> None:
    model = tiny(dropout=0.3)
    ids = torch.randint(0, 61, (2, 6))
    torch.testing.assert_close(model(ids).logits, model(ids).logits)
    model.train()
    assert not torch.allclose(model(ids).logits, model(ids).logits)


def _grads(model: al.GPT, ids: torch.Tensor, mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
    model.zero_grad()
    torch.manual_seed(1)
    model(ids, mask, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("variant", ["learned", "rope", "alibi"])
def test_gradient_checkpointing_gives_the_same_gradients(variant: str) -> None:
    model = tiny(dropout=0.1, **VARIANTS[variant]).double().train()
    ids, mask = left_padded()
    plain = _grads(model, ids, mask)
    model.gradient_checkpointing = True
    ckpt = _grads(model, ids, mask)
    assert plain.keys() == ckpt.keys()
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], atol=1e-12, rtol=1e-10, msg=name)
    assert any(g.abs().sum() > 0 for g in plain.values())
    # the config flag turns it on as well; it stays off outside training
    assert tiny(gradient_checkpointing=True).gradient_checkpointing


def test_gradient_checkpointing_recomputes_each_block_only_in_training() -> None:
    """A checkpointed block runs again inside backward (its pre-hook fires twice: the
    non-reentrant recomputation stops before the block returns); evaluation, ``no_grad`` and
    decoding with a cache run it once."""
    model = tiny(gradient_checkpointing=True).train()
    ids = torch.randint(0, 61, (2, 6))
    calls: list[int] = []
    handle = model.transformer.h[1].register_forward_pre_hook(lambda *a: calls.append(1))
    model(ids, labels=ids).loss.backward()
    assert len(calls) == 2
    with torch.no_grad():
        model(ids)
    assert len(calls) == 3
    model.eval()
    model(ids, labels=ids).loss.backward()
    assert len(calls) == 4
    model.train()
    cache = model.new_cache(2, 6)
    model(ids, cache=cache).logits.sum().backward()  # a cache: never checkpointed
    handle.remove()
    assert len(calls) == 5


def test_bf16_autocast_runs_and_tracks_fp32() -> None:
    model = tiny().train()
    ids = torch.randint(0, 61, (2, 8))
    ref = model(ids, labels=ids).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, labels=ids)
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32
    assert abs(out.loss.item() - ref.item()) < 0.05 * ref.item()
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_bf16_autocast_with_cache() -> None:
    model = tiny(positions="rope").eval()
    ids = torch.randint(0, 61, (2, 6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(ids).logits
        cache = model.new_cache(2, 6)
        assert cache.layers[0].k.dtype == torch.bfloat16
        steps = [model(ids[:, :4], cache=cache).logits]
        steps += [model(ids[:, i : i + 1], cache=cache).logits for i in (4, 5)]
    torch.testing.assert_close(torch.cat(steps, 1).float(), full.float(), atol=0.05, rtol=0.05)
    # an fp32 cache read under autocast also works
    fp32_cache = model.new_cache(2, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model(ids, cache=fp32_cache).logits).all()


# -- errors --


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_too_long_input_names_n_positions(positions: str) -> None:
    model = tiny(positions=positions)
    with pytest.raises(ValueError, match="n_positions = 24"):
        model(torch.zeros(1, 25, dtype=torch.long))
    cache = model.new_cache(1, 30)
    model(torch.zeros(1, 20, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"5 tokens after 20 cached.*n_positions = 24"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)


def test_bad_inputs_raise_clear_errors() -> None:
    model = tiny()
    ids = torch.randint(0, 61, (2, 5))
    with pytest.raises(ValueError, match=r"\[0, vocab_size = 61\), got token id 61"):
        model(torch.tensor([[1, 61]]))
    with pytest.raises(ValueError, match="got token id -1"):
        model(torch.tensor([[1, -1]]))
    with pytest.raises(
        TypeError, match=r"input_ids must be integer token ids, got dtype torch\.float32"
    ):
        model(ids.float())
    with pytest.raises(TypeError, match=r"input_ids must be a torch\.Tensor, got list"):
        model([[1, 2]])
    with pytest.raises(
        ValueError, match=r"input_ids must have shape \(B, T\) with T >= 1, got \(5,\)"
    ):
        model(ids[0])
    with pytest.raises(
        ValueError,
        match=r"attention_mask must have shape \(B, T_past \+ T\) = \(2, 5\), got \(2, 4\)",
    ):
        model(ids, torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="attention_mask must be 0/1 integers or bool"):
        model(ids, torch.ones(2, 5))
    with pytest.raises(
        ValueError,
        match=r"labels must have the shape of input_ids \(B, T\) = \(2, 5\), got \(2, 4\)",
    ):
        model(ids, labels=ids[:, :4])
    with pytest.raises(ValueError, match=r"position_ids must have shape \(B, T\) = \(2, 5\)"):
        model(ids, position_ids=torch.arange(4))
    with pytest.raises(ValueError, match="cache was made for batch 3, input_ids has batch 2"):
        model(ids, cache=model.new_cache(3, 8))
    with pytest.raises(TypeError, match="config must be a GPTConfig"):
        al.GPT({"n_layer": 2})  # type: ignore[arg-type]


def test_cache_capacity_exceeded() -> None:
    model = tiny()
    cache = model.new_cache(1, 4)
    model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="KV cache capacity exceeded"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=cache)


def test_gradient_checkpointing_with_a_head_mask_gives_the_same_gradients() -> None:
    """The head mask travels through torch.utils.checkpoint: the gradients of the weights and of
    the mask itself (Michel et al.'s head importance) equal the plain run's, bit for bit."""
    model = tiny(dropout=0.1).train()
    ids, mask = left_padded()

    def run() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        xi = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.5, 1.0, 1.0, 0.0]], requires_grad=True)
        torch.manual_seed(1)
        model(ids, mask, labels=ids, head_mask=xi).loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}  # type: ignore[union-attr]
        return xi.grad, grads  # type: ignore[return-value]

    xi_plain, plain = run()
    model.gradient_checkpointing = True
    xi_ckpt, ckpt = run()
    assert torch.equal(xi_ckpt, xi_plain) and bool((xi_plain != 0).any())
    for name in plain:
        assert torch.equal(ckpt[name], plain[name]), name


def test_gpt_self_attention_alone_is_causal() -> None:
    """GPTSelfAttention says it is causal: on its own, as inside a block, a token does not see
    the tokens after it (``is_causal=False`` turns that off explicitly)."""
    attn = GPTSelfAttention(16, 2)
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[:, 4:] = torch.randn(1, 2, 16)  # change the future of token 3
    assert torch.equal(attn(x)[:, :4], attn(y)[:, :4])
    assert not torch.allclose(attn(x, is_causal=False)[:, :4], attn(y, is_causal=False)[:, :4])
    assert not al.MultiHeadAttention.causal and GPTSelfAttention.causal
