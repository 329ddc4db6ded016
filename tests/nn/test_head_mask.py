"""head_mask: switching attention heads off (Michel et al. 2019; Hugging Face's ``head_mask``).

MultiHead(x) = Σ_h ξ_h · head_h(x) W^O_h + b^O — checked against a float64 reference written as
that sum, on every backend; None and all-ones masks bit-identical to no mask; gradients with
respect to ξ; the layers and models pass the masks through; GPT matches Hugging Face GPT-2.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import GPT2LMHeadModel
from transformers.models.gpt2 import modeling_gpt2

import attnlab as al
from attnlab import masks
from attnlab.inspect import capture
from attnlab.nn.layers import DecoderLayer, EncoderLayer
from tests.reference import assert_close_rule, attention_ref

BACKENDS = ["math", "sdpa", "blockwise", "blockwise_python"]
D, H = 32, 4


def mha_of(
    backend: str = "math", num_kv_heads: int | None = None, **kw: object
) -> al.MultiHeadAttention:
    mha = al.MultiHeadAttention(D, H, num_kv_heads=num_kv_heads, backend=backend, **kw)  # type: ignore[arg-type]
    with torch.no_grad():  # non-zero biases so that every parameter matters
        mha.in_proj_bias.normal_()  # type: ignore[union-attr]
        mha.out_proj.bias.normal_()
    return mha.eval()


def ref_heads_sum(
    mha: al.MultiHeadAttention,
    x: torch.Tensor,
    y: torch.Tensor | None,
    xi: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``b^O + Σ_h ξ_h · head_h W^O_h``, one head at a time (float64 when ``upcast``).

    ``xi`` is ``(H,)`` or ``(B, H)``; returns ``(output, masked weights)``.
    """
    dt = torch.float64 if upcast else x.dtype
    w, b = mha.in_proj_weight.detach().to(dt), mha.in_proj_bias.detach().to(dt)  # type: ignore[union-attr]
    kv = mha.num_kv_heads * mha.d_head
    x, y = x.to(dt), (x if y is None else y).to(dt)
    q = x @ w[:D].T + b[:D]
    k = y @ w[D : D + kv].T + b[D : D + kv]
    v = y @ w[D + kv :].T + b[D + kv :]

    def heads(t: torch.Tensor, n: int) -> torch.Tensor:
        return t.unflatten(-1, (n, mha.d_head)).transpose(1, 2)

    z, weights = attention_ref(
        heads(q, H), heads(k, mha.num_kv_heads), heads(v, mha.num_kv_heads), mask,
        is_causal=is_causal, upcast=upcast,
    )  # fmt: skip
    xi = xi.to(dt).expand(x.shape[0], H)  # (B, H)
    w_o, b_o = mha.out_proj.weight.detach().to(dt), mha.out_proj.bias.detach().to(dt)
    out = b_o.expand(x.shape[0], x.shape[1], D).clone()
    for h in range(H):
        if bool((xi[:, h] != 0).any()):  # a removed head is not computed at all
            cols = slice(h * mha.d_head, (h + 1) * mha.d_head)
            out = out + xi[:, h, None, None] * (z[:, h] @ w_o[:, cols].T)
    return out, weights * xi[:, :, None, None]


# ------------------------------------------------------------------ exactness of "no mask"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_none_and_all_ones_are_bit_identical(
    backend: str, cross: bool, num_kv_heads: int | None
) -> None:
    mha = mha_of(backend, num_kv_heads)
    x, y = torch.randn(2, 5, D), torch.randn(2, 7, D) if cross else None
    pad = masks.padding_mask(torch.tensor([[3] * 7, [3] * 5 + [0] * 2]), 0)[
        ..., : 7 if cross else 5
    ]
    for kwargs in ({}, {"mask": pad}, {"is_causal": not cross}):
        plain = mha(x, y, **kwargs)
        for ones in (torch.ones(H), torch.ones(2, H), torch.ones(H, dtype=torch.bool)):
            assert torch.equal(mha(x, y, head_mask=ones, **kwargs), plain)
        out, w = mha(x, y, need_weights=True, **kwargs)
        out1, w1 = mha(x, y, need_weights=True, head_mask=torch.ones(1, H), **kwargs)
        assert torch.equal(out1, out) and torch.equal(w1, w)


def test_all_ones_leave_models_bit_identical() -> None:
    gpt = al.GPT(al.GPTConfig(vocab_size=50, n_positions=16, n_embd=D, n_layer=2, n_head=H)).eval()
    ids = torch.randint(0, 50, (2, 9))
    assert torch.equal(gpt(ids, head_mask=torch.ones(2, H)).logits, gpt(ids).logits)
    model = al.Transformer(_tiny_seq2seq()).eval()
    src, tgt = torch.randint(3, 20, (2, 6)), torch.randint(3, 20, (2, 5))
    enc, dec = torch.ones(2, H), torch.ones(3, H)
    got = model(src, tgt, head_mask=enc, decoder_head_mask=dec, cross_attn_head_mask=dec)
    assert torch.equal(got.logits, model(src, tgt).logits)


# ------------------------------------------------------------------ against the float64 reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
def test_zeroed_head_matches_float64_reference(
    backend: str, cross: bool, num_kv_heads: int | None
) -> None:
    mha = mha_of(backend, num_kv_heads)
    x, y = torch.randn(3, 6, D), torch.randn(3, 9, D) if cross else None
    causal = not cross
    for xi in (
        torch.tensor([1.0, 0.0, 1.0, 1.0]),  # one head removed
        torch.tensor([0.0, 1.0, 0.0, 0.0]),  # only head 1 left
        torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.5, 2.0, 1.0, -1.0]]),  # (B, H)
    ):
        got, got_w = mha(x, y, is_causal=causal, need_weights=True, head_mask=xi)
        ref, ref_w = ref_heads_sum(mha, x, y, xi, is_causal=causal)
        base, base_w = ref_heads_sum(mha, x, y, xi, is_causal=causal, upcast=False)
        assert_close_rule(got, ref, base, "output")
        assert_close_rule(got_w, ref_w, base_w, "weights")
        # a removed head's weights are exactly zero, and its output contributes nothing
        dropped = (xi.expand(3, H) == 0).nonzero()
        assert all(bool((got_w[b, h] == 0).all()) for b, h in dropped.tolist())


def test_removing_every_head_leaves_the_output_bias() -> None:
    mha = mha_of("sdpa")
    x = torch.randn(2, 5, D)
    out = mha(x, head_mask=torch.zeros(H))
    torch.testing.assert_close(out, mha.out_proj.bias.expand_as(out), atol=0, rtol=0)


def test_hooks_see_the_masked_weights_and_outputs() -> None:
    mha = mha_of("auto")
    x, xi = torch.randn(2, 5, D), torch.tensor([1.0, 0.0, 0.5, 1.0])
    with capture(mha, hooks=("hook_z",)) as cache:
        out = mha(x, is_causal=True, head_mask=xi)
    assert torch.equal(out, mha(x, is_causal=True, head_mask=xi))  # capturing changes nothing
    _, ref_w = ref_heads_sum(mha, x, None, xi, is_causal=True)
    torch.testing.assert_close(cache.attentions[""], ref_w.float(), atol=1e-6, rtol=0)
    assert bool((cache.activations["hook_z"][:, 1] == 0).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_steps_with_a_head_mask_equal_the_full_pass(backend: str) -> None:
    from attnlab.nn.kv_cache import KVCache

    mha = mha_of(backend, num_kv_heads=2)
    x, xi = torch.randn(2, 6, D), torch.tensor([0.0, 1.0, 1.0, 0.0])
    full = mha(x, is_causal=True, head_mask=xi)
    cache = KVCache(2, 2, 6, mha.d_head)
    steps = [mha(x[:, t : t + 1], is_causal=True, cache=cache, head_mask=xi) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-6, rtol=0)


# ------------------------------------------------------------------ gradients with respect to ξ


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_mask_gradient_matches_finite_differences(backend: str) -> None:
    mha = mha_of(backend).double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    xi = torch.tensor([1.0, 0.0, 0.7, 1.3], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda m: mha(x, is_causal=True, head_mask=m), (xi,))
    xi_b = torch.rand(2, H, dtype=torch.float64, requires_grad=True)  # per-example ξ
    assert torch.autograd.gradcheck(lambda m: mha(x, head_mask=m), (xi_b,))


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_mask_gradient_matches_float64_reference(backend: str) -> None:
    mha = mha_of(backend)
    x, y = torch.randn(3, 6, D), torch.randn(3, 4, D)
    target = torch.randn(3, 6, D)

    def grad(fn: object, dtype: torch.dtype) -> torch.Tensor:
        xi = torch.ones(H, dtype=dtype, requires_grad=True)
        out = fn(xi)  # type: ignore[operator]
        # L = ½ ||out − target||²: ∂L/∂ξ_h = <head_h W^O_h, out − target> at ξ = 1
        ((out - target.to(out.dtype)) ** 2).sum().mul(0.5).backward()
        return xi.grad  # type: ignore[return-value]

    got = grad(lambda m: mha(x, y, head_mask=m), torch.float32)
    ref = grad(lambda m: ref_heads_sum(mha, x, y, m)[0], torch.float64)
    base = grad(lambda m: ref_heads_sum(mha, x, y, m, upcast=False)[0], torch.float32)
    assert_close_rule(got, ref, base, "d loss / d head_mask", factor=4.0)
    assert bool((ref.abs() > 1e-3).all())  # not a vacuous comparison


# ------------------------------------------------------------------ layers and models


def _tiny_seq2seq(**overrides: object) -> al.TransformerConfig:
    kwargs: dict = dict(
        src_vocab_size=20, tgt_vocab_size=20, d_model=D, num_heads=H, num_encoder_layers=2,
        num_decoder_layers=3, d_ff=64, dropout=0.0, max_len=32,
    )  # fmt: skip
    kwargs.update(overrides)
    return al.TransformerConfig(**kwargs)


def test_encoder_and_decoder_layers_pass_the_masks_to_their_attention() -> None:
    enc, dec = EncoderLayer(D, H, 64).eval(), DecoderLayer(D, H, 64).eval()
    x, mem = torch.randn(2, 5, D), torch.randn(2, 7, D)
    xi = torch.tensor([1.0, 0.0, 1.0, 0.0])
    seen: dict[str, torch.Tensor] = {}

    def spy(name: str) -> object:
        return lambda mod, args, kwargs: seen.__setitem__(name, kwargs.get("head_mask"))

    enc.self_attn.register_forward_pre_hook(spy("enc"), with_kwargs=True)  # type: ignore[arg-type]
    dec.self_attn.register_forward_pre_hook(spy("self"), with_kwargs=True)  # type: ignore[arg-type]
    dec.cross_attn.register_forward_pre_hook(spy("cross"), with_kwargs=True)  # type: ignore[arg-type]
    enc(x, head_mask=xi)
    dec(x, mem, is_causal=True, head_mask=xi, cross_attn_head_mask=1 - xi)
    assert seen["enc"] is xi and seen["self"] is xi and torch.equal(seen["cross"], 1 - xi)
    # no cross-attention head left: the memory no longer matters
    off = torch.zeros(H)
    a = dec(x, mem, is_causal=True, cross_attn_head_mask=off)
    b = dec(x, torch.randn(2, 7, D), is_causal=True, cross_attn_head_mask=off)
    assert torch.equal(a, b)


def test_transformer_head_masks_reach_the_right_layers() -> None:
    model = al.Transformer(_tiny_seq2seq()).eval()
    src, tgt = torch.randint(3, 20, (2, 6)), torch.randint(3, 20, (2, 5))
    enc = torch.rand(2, H)
    dec_self, cross = torch.rand(3, H), torch.rand(3, H)
    seen: dict[str, torch.Tensor | None] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, al.MultiHeadAttention):
            mod.register_forward_pre_hook(
                lambda m, a, kw, name=name: seen.__setitem__(name, kw.get("head_mask")),
                with_kwargs=True,
            )
    model(src, tgt, head_mask=enc, decoder_head_mask=dec_self, cross_attn_head_mask=cross)
    for i in range(2):
        assert torch.equal(seen[f"encoder.layers.{i}.self_attn"], enc[i])  # type: ignore[arg-type]
    for i in range(3):
        assert torch.equal(seen[f"decoder.layers.{i}.self_attn"], dec_self[i])  # type: ignore[arg-type]
        assert torch.equal(seen[f"decoder.layers.{i}.cross_attn"], cross[i])  # type: ignore[arg-type]
    # (H,) means the same heads in every layer
    xi = torch.tensor([1.0, 0.0, 1.0, 1.0])
    torch.testing.assert_close(
        model(src, tgt, decoder_head_mask=xi).logits,
        model(src, tgt, decoder_head_mask=xi.expand(3, H)).logits,
        atol=0,
        rtol=0,
    )
    # without cross-attention the source no longer matters; encode/decode take the masks too
    off = torch.zeros(H)
    a = model(src, tgt, cross_attn_head_mask=off).logits
    b = model(torch.randint(3, 20, (2, 6)), tgt, cross_attn_head_mask=off).logits
    assert torch.equal(a, b)
    memory = model.encode(src, head_mask=enc)
    out = model.decode(
        tgt, memory, src_mask=masks.padding_mask(src, 0), decoder_head_mask=dec_self,
        cross_attn_head_mask=cross,
    )  # fmt: skip
    full = model(src, tgt, head_mask=enc, decoder_head_mask=dec_self, cross_attn_head_mask=cross)
    assert torch.equal(out.logits, full.logits)


def test_gpt_head_mask_broadcast_and_gradient() -> None:
    gpt = al.GPT(al.GPTConfig(vocab_size=50, n_positions=16, n_embd=D, n_layer=3, n_head=H)).eval()
    ids = torch.randint(0, 50, (2, 9))
    xi = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert torch.equal(gpt(ids, head_mask=xi).logits, gpt(ids, head_mask=xi.expand(3, H)).logits)
    assert torch.equal(
        gpt(ids, head_mask=xi.bool()).logits, gpt(ids, head_mask=xi.expand(3, H)).logits
    )
    # ∂L/∂ξ by autograd equals central differences (float64; L = <logits, r>, since the
    # cross-entropy is computed in float32)
    gpt = gpt.double()
    r = torch.randn(2, 9, 50, dtype=torch.float64)

    def loss(m: torch.Tensor) -> torch.Tensor:
        return (gpt(ids, head_mask=m).logits * r).sum()

    m = torch.ones(3, H, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(loss(m), m)
    eps = 1e-6
    for layer, head in [(0, 0), (1, 2), (2, 3)]:
        e = torch.zeros(3, H, dtype=torch.float64)
        e[layer, head] = eps
        with torch.no_grad():
            fd = (loss(1 + e) - loss(1 - e)) / (2 * eps)
        assert abs(float(fd) - float(g[layer, head])) < 1e-6 * (1 + abs(float(fd)))
        assert abs(float(fd)) > 1e-3


def _eager_with_head_mask(head_mask: torch.Tensor, n_layer: int) -> object:
    """Hugging Face GPT-2's eager attention as transformers 4.x wrote it, with ``head_mask``
    (removed in transformers 5, huggingface/transformers#41076): the probabilities are multiplied
    by the layer's mask after dropout, ``head_mask`` prepared by ``get_head_mask`` as
    ``(n_layer, 1, n_head, 1, 1)``."""
    mask5 = head_mask if head_mask.dim() == 2 else head_mask.expand(n_layer, -1)
    mask5 = mask5[:, None, :, None, None]

    def eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):  # type: ignore[no-untyped-def]
        scaling = query.size(-1) ** -0.5 if scaling is None else scaling
        attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = torch.softmax(attn_weights, dim=-1).type(value.dtype)
        attn_weights = torch.nn.functional.dropout(
            attn_weights, p=dropout, training=module.training
        )
        attn_weights = attn_weights * mask5[module.layer_idx]  # "Mask heads if we want to"
        attn_output = torch.matmul(attn_weights, value).transpose(1, 2)
        return attn_output, attn_weights

    return eager


@pytest.mark.parametrize(
    "head_mask",
    [
        torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]]),
        torch.tensor([0.0, 1.0, 1.0, 0.0]),  # (n_head,): every layer
    ],
)
def test_gpt_head_mask_matches_hugging_face_gpt2(
    head_mask: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.models.test_hf import hf_model

    hf = hf_model("eager")
    gpt = al.GPT.from_hf(hf).eval()
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        if "head_mask" in inspect.signature(GPT2LMHeadModel.forward).parameters:  # transformers 4
            ref = hf(ids, head_mask=head_mask).logits
        else:  # transformers 5 removed head masking: the 4.x eager attention, restored locally
            monkeypatch.setattr(
                modeling_gpt2,
                "eager_attention_forward",
                _eager_with_head_mask(head_mask, hf.config.n_layer),
            )
            ref = hf(ids).logits
            monkeypatch.undo()
            assert (hf(ids).logits - ref).abs().max() > 1e-2  # the mask did change HF's logits
        got = gpt(ids, head_mask=head_mask).logits
    assert (got - ref).abs().max() < 1e-4


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("head_mask", "error", "words"),
    [
        ([1.0, 0.0, 1.0, 1.0], TypeError, "head_mask must be a torch.Tensor, got list"),
        (torch.tensor([1, 0, 1, 1]), TypeError, "head_mask must be floating .* got dtype torch.int64"),
        (torch.ones(3), ValueError, r"head_mask has shape \(3,\) but must broadcast to \(B, H\) = \(2, 4\)"),
        (torch.ones(3, H), ValueError, r"head_mask has shape \(3, 4\) but must broadcast"),
        (torch.ones(2, H, 1), ValueError, r"head_mask has shape \(2, 4, 1\)"),
        (torch.tensor([1.0, float("nan"), 1.0, 1.0]), ValueError, "head_mask must be finite"),
    ],
)  # fmt: skip
def test_bad_head_masks_are_refused(head_mask: object, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        mha_of()(torch.randn(2, 5, D), head_mask=head_mask)


def test_bad_model_head_masks_name_the_argument() -> None:
    gpt = al.GPT(al.GPTConfig(vocab_size=50, n_positions=16, n_embd=D, n_layer=2, n_head=H))
    ids = torch.randint(0, 50, (2, 5))
    with pytest.raises(ValueError, match=r"head_mask must have shape \(num_layers, num_heads\) = \(2, 4\) or \(num_heads,\) = \(4,\), got \(3, 4\)"):  # fmt: skip
        gpt(ids, head_mask=torch.ones(3, H))
    with pytest.raises(TypeError, match="head_mask must be floating"):
        gpt(ids, head_mask=torch.ones(2, H, dtype=torch.long))
    model = al.Transformer(_tiny_seq2seq())
    src, tgt = torch.randint(3, 20, (2, 6)), torch.randint(3, 20, (2, 5))
    with pytest.raises(ValueError, match=r"^head_mask must have shape .* = \(2, 4\)"):
        model(src, tgt, head_mask=torch.ones(3, H))
    with pytest.raises(ValueError, match=r"^decoder_head_mask must have shape .* = \(3, 4\)"):
        model(src, tgt, decoder_head_mask=torch.ones(2, H))
    with pytest.raises(ValueError, match=r"^cross_attn_head_mask must have shape .*got \(5,\)"):
        model(src, tgt, cross_attn_head_mask=torch.ones(5))
    with pytest.raises(ValueError, match="head_mask must be finite"):
        model(src, tgt, cross_attn_head_mask=torch.full((H,), float("inf")))
