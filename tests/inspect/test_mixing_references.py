"""Every context-mixing method against a float64 reference written from its paper's equations, on
every family × attention kind (issue 34's coverage matrix; the per-method tests of the equations
themselves are in test_mixing.py).

The reference recomputes each attention layer by hand from the residual stream entering its
block — ``q, k, v`` from the fused projection, the rotary turn, ``softmax(q kᵀ/√d + bias)`` over the
keys the kind lets a query see (the band by hand for a sliding window; the layout's own blocks for
BigBird), ``W_O`` read as a matrix — and the whole model by hand for the gradient method, so a
method that read the wrong tensor, dropped a grouped key/value head, missed a hidden key or the
residual stream would differ here.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnlab as al
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.mixing import LayerRun, mixing, record_layers, value_norms
from attnlab.nn.kinds import BigBirdSpec, SlidingSpec
from tests.inspect.test_mixing import seq2seq, tiny

FAMILIES = {
    "gpt2": {},  # LayerNorm, learned positions, biases everywhere
    "llama": dict(positions="rope", num_kv_heads=2, norm="rmsnorm", mlp="gated", bias=False),
    "qwen2": dict(
        positions="rope", num_kv_heads=2, norm="rmsnorm", mlp="gated", bias=False, qkv_bias=True
    ),
    "neox": dict(positions="rope", parallel_residual=True, rotary_dim=4),
    "alibi": dict(positions="alibi"),
}
WINDOW = 2
KINDS = {
    "full": {},
    "sliding": dict(attention=SlidingSpec(window=WINDOW)),  # with llama: Mistral
    "bigbird": dict(attention=BigBirdSpec(block_size=2, num_random_blocks=1)),
}
CASES = [(f, k) for f in FAMILIES for k in KINDS]
IDS = [f"{f}-{k}" for f, k in CASES]
# integrated gradients sees the model only through its embeddings: every family, and the kinds
# on one of them (each case runs 32-step integrals for every position)
IG_CASES = [(f, "full") for f in FAMILIES] + [("llama", "sliding"), ("llama", "bigbird")]
T = 8


def model_of(family: str, kind: str) -> al.GPT:
    return tiny(**FAMILIES[family], **KINDS[kind])


# -- the reference -------------------------------------------------------------------------------


def visible_by_hand(r: LayerRun, kind: str, causal: bool = True) -> torch.Tensor:
    """The keys each query sees, ``(T_q, T_k)``: written out for full and sliding attention; for
    BigBird the layout's own blocks (its layout is tested in tests/nn), checked to be causal at
    a causal site."""
    t = r.call.q.shape[-2]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    if kind == "full":
        return j <= i if causal else torch.ones(t, t, dtype=torch.bool)
    if kind == "sliding":  # itself and the w tokens before it (both sides in an encoder)
        return (j <= i) & (j >= i - WINDOW) if causal else (j - i).abs() <= WINDOW
    layout = r.call.visible()[0, 0]
    assert layout.diagonal().all() and not layout.all(-1).all()  # it hides something
    assert not causal or not layout[j > i].any()
    return layout


def attention_by_hand(
    attn: torch.nn.Module, h: torch.Tensor, visible: torch.Tensor, bias: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """One attention layer from its equations: ``A = softmax(q kᵀ/√d + bias)`` over the visible
    keys, the values of each query head (grouped heads repeated), ``W_O`` per head and ``b_O``."""
    b, t, d_model = h.shape
    heads, kv, d = attn.num_heads, attn.num_kv_heads, attn.d_head
    w, qkv_bias = attn.qkv_parameters()
    qkv = h @ w.T + (0 if qkv_bias is None else qkv_bias)
    q, k, v = qkv.split([heads * d, kv * d, kv * d], -1)
    q, k, v = (x.view(b, t, -1, d).transpose(1, 2) for x in (q, k, v))
    if attn.rotary is not None:
        q, k = attn.rotary(q, torch.arange(t)), attn.rotary(k, torch.arange(t))
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if bias is not None:
        s = s + bias
    a = s.masked_fill(~visible, float("-inf")).softmax(-1)
    zero = torch.zeros(1, heads * d, dtype=h.dtype)
    b_o = attn.project_out(zero)[0]
    w_o = attn.project_out(torch.eye(heads * d, dtype=h.dtype)) - b_o  # (H·d, d_model): x W_O
    w_o = w_o.view(heads, d, d_model)
    f = torch.einsum("bhjd,hde->bhje", v, w_o)  # f_h(x_j) = W_O^h v^h_j
    return {"a": a, "v": v, "w_o": w_o, "b_o": b_o, "f": f}


def alibi(model: al.GPT, t: int = T) -> torch.Tensor | None:
    """ALiBi's ``−m_h (i − j)``, or ``None`` for the other position schemes."""
    if model.config.positions != "alibi":
        return None
    return al.nn.positional.alibi_bias(model.config.n_head, t, t, dtype=torch.float64)


def residual_by_hand(a: torch.Tensor, f: torch.Tensor, x: torch.Tensor | None) -> torch.Tensor:
    """``T_i(x_j) = Σ_h α^h_ij f_h(x_j)`` (+ ``x_i`` when ``j = i``), ``(B, T_q, T_k, d)``."""
    vec = torch.einsum("bhij,bhje->bije", a, f)
    if x is not None:
        idx = torch.arange(x.shape[1])
        vec[:, idx, idx] += x
    return vec


def alti_by_hand(vec: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Ferrando et al. eq. 8–9: ``c_ij ∝ max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)``; a row where no
    part comes closer to ``y_i`` than zero does (0/0) keeps itself (its own position, or a
    cross-attention block's residual column), as the library states."""
    c = (y.abs().sum(-1)[..., None] - (y[:, :, None] - vec).abs().sum(-1)).clamp(min=0)
    own = torch.eye(c.shape[-2], c.shape[-1], dtype=c.dtype)  # its own position
    if c.shape[-1] != c.shape[-2]:  # a cross-attention block: its residual column, the last
        own = torch.zeros_like(own)
        own[:, -1] = 1.0
    total = c.sum(-1, keepdim=True)
    return torch.where(total > 0, c / total, own.expand_as(c))


def with_identity(a: torch.Tensor) -> torch.Tensor:
    m = 0.5 * a + 0.5 * torch.eye(a.shape[-1], dtype=a.dtype)
    return m / m.sum(-1, keepdim=True)


def cosine_change(zeroed: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """Mohebbi et al.: ``c_ij = 1 − cos(ỹ_i^{¬j}, y_i)``, rows normalised; ``zeroed[:, j, i]``."""
    change = (1 - F.cosine_similarity(zeroed, clean[:, None], dim=-1)).transpose(1, 2)
    change = change.clamp(min=0)
    return change / change.sum(-1, keepdim=True)


# -- GPT families × kinds ------------------------------------------------------------------------


@pytest.mark.parametrize(("family", "kind"), CASES, ids=IDS)
def test_per_layer_methods_equal_their_equations(family: str, kind: str) -> None:
    # weights, rollout, flow, norm, norm_residual, alti: each from the layer recomputed by hand
    model = model_of(family, kind)
    ids = torch.randint(0, 40, (2, T))
    runs, _ = record_layers(model, lambda: model(ids))
    got = {
        m: mixing(model, ids, m, heads=True)
        for m in ("weights", "rollout", "norm", "norm_residual")
    }
    got["alti"] = mixing(model, ids, "alti")
    refs, alti_layers = [], []
    for layer, (r, block) in enumerate(zip(runs, model.transformer.h)):
        x = r.resid_pre
        ref = attention_by_hand(block.attn, block.ln_1(x), visible_by_hand(r, kind), alibi(model))
        a, f = ref["a"], ref["f"]
        refs.append(ref)
        close = dict(rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got["weights"].per_head[layer], a, **close)
        torch.testing.assert_close(got["weights"].per_layer[layer], a.mean(1), **close)
        # Kobayashi 2020: ‖α^h_ij f_h(x_j)‖ per head, ‖Σ_h α^h_ij f_h(x_j)‖ summed
        torch.testing.assert_close(got["norm"].per_head[layer], a * f.norm(dim=-1)[:, :, None])
        torch.testing.assert_close(value_norms(r), f.norm(dim=-1), **close)  # ‖W_O^h v^h_j‖
        vec = residual_by_hand(a, f, None)
        torch.testing.assert_close(got["norm"].per_layer[layer], vec.norm(dim=-1), **close)
        # Kobayashi 2021: with the residual; the parts and b_O are the stream after attention
        vec = residual_by_hand(a, f, x)
        torch.testing.assert_close(got["norm_residual"].per_layer[layer], vec.norm(dim=-1), **close)
        y = vec.sum(2) + ref["b_o"]
        torch.testing.assert_close(y, x + r.attn_out, rtol=0, atol=1e-12)
        c = alti_by_hand(vec, y)
        torch.testing.assert_close(c.sum(-1), torch.ones(2, T, dtype=torch.float64))
        torch.testing.assert_close(got["alti"].per_layer[layer], c, **close)
        alti_layers.append(c)
    # rollout: R = Ã_2 Ã_1; ALTI: C_2 C_1 (the residual already counted)
    a1, a2 = (with_identity(ref["a"].mean(1)) for ref in refs)
    torch.testing.assert_close(got["rollout"].total, a2 @ a1, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got["alti"].total, alti_layers[1] @ alti_layers[0])
    # flow through two layers: the paths j → k → i share no edge, so the maximum flow is
    # Σ_k min(Ã_1[k, j], Ã_2[i, k])
    flow = mixing(model, ids[:1], "flow").total[0]
    expected = torch.minimum(a1[0][None], a2[0][:, :, None]).sum(1)  # [i, k, j] → [i, j]
    torch.testing.assert_close(flow, expected, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize(("family", "kind"), CASES, ids=IDS)
def test_value_zeroing_equals_the_block_rerun_by_hand(family: str, kind: str) -> None:
    # Mohebbi et al. 2023: the block rerun with token j's values zeroed (every head)
    model = model_of(family, kind)
    ids = torch.randint(0, 40, (2, T))  # two rows: each zeroes only its own copies
    got = mixing(model, ids, "value_zeroing").per_layer
    runs, _ = record_layers(model, lambda: model(ids))
    for layer, (r, block) in enumerate(zip(runs, model.transformer.h)):
        x = r.resid_pre
        ref = attention_by_hand(block.attn, block.ln_1(x), visible_by_hand(r, kind), alibi(model))
        outs = []
        for j in range(T + 1):  # the last: nothing zeroed
            keep = torch.ones(T, 1, dtype=torch.float64)
            keep[j:j + 1] = 0.0  # fmt: skip
            z = ref["a"] @ (ref["v"] * keep)  # (B, H, T, d)
            attn_out = torch.einsum("bhid,hde->bie", z, ref["w_o"]) + ref["b_o"]
            outs.append(block.add_to_stream(x, attn_out))
        zeroed, clean = torch.stack(outs[:T], 1), outs[T]
        expected = cosine_change(zeroed, clean)
        torch.testing.assert_close(got[layer], expected, rtol=1e-8, atol=1e-10)
        hidden = ~visible_by_hand(r, kind)
        # a key no query of this layer sees changes nothing in it
        assert got[layer][:, hidden].abs().max() < 1e-12


def forward_by_hand(
    model: al.GPT, ids: torch.Tensor, kind: str
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The whole model with every attention layer by hand: the logits and each layer's weights
    (the tensors that multiply the values, for ``∂s/∂A``)."""
    runs, out = record_layers(model, lambda: model(ids))
    x = runs[0].resid_pre
    weights = []
    for r, block in zip(runs, model.transformer.h):
        t = x.shape[1]
        ref = attention_by_hand(
            block.attn, block.ln_1(x), visible_by_hand(r, kind), alibi(model, t)
        )
        attn_out = torch.einsum("bhid,hde->bie", ref["a"] @ ref["v"], ref["w_o"]) + ref["b_o"]
        x = block.add_to_stream(x, attn_out)
        weights.append(ref["a"])
    logits = model.lm_head(model.transformer.ln_f(x))
    torch.testing.assert_close(logits, out.logits, rtol=1e-10, atol=1e-10)
    return logits, weights


@pytest.mark.parametrize(("family", "kind"), CASES, ids=IDS)
def test_grad_weights_equals_chefer_on_the_model_by_hand(family: str, kind: str) -> None:
    # Chefer et al. 2021, eq. 13–14: Ā = E_h[(∇A ⊙ A)^+], R ← R + Ā R from R = I
    model = model_of(family, kind)
    ids = torch.randint(0, 40, (2, 6))
    got = mixing(model, ids, "grad_weights").total
    logits, weights = forward_by_hand(model, ids, kind)
    targets = logits.argmax(-1)
    for row in range(2):
        for i in range(6):
            score = logits[row, i, targets[row, i]]
            grads = torch.autograd.grad(score, weights, retain_graph=True)
            r = torch.eye(6, dtype=torch.float64)
            for a, g in zip(weights, grads):
                r = r + (g * a).clamp(min=0).mean(1)[row] @ r
            torch.testing.assert_close(got[row, i], r[i].detach(), rtol=1e-9, atol=1e-12)
    if kind == "sliding":  # two layers of a band of w: nothing from further than 2w back
        far = torch.ones(6, 6, dtype=torch.bool).tril(-2 * WINDOW - 1)
        assert got[:, far].abs().max() == 0


@pytest.mark.parametrize(("family", "kind"), IG_CASES, ids=[f"{f}-{k}" for f, k in IG_CASES])
def test_integrated_gradients_are_complete_and_see_what_the_kind_lets_through(
    family: str, kind: str
) -> None:
    # Sundararajan et al.: Σ_j IG_ij = f_i(x) − f_i(baseline) (up to the Riemann sum's error); a
    # token no path reaches gets exactly nothing. From the zero vector (the old baseline) the
    # sum missed by over 100% on every family without a position table: their first norm
    # rescales the path's small inputs by up to 1/√ε
    model = model_of(family, kind)
    ids = torch.randint(0, 40, (1, 6))
    ig = mixing(model, ids, "integrated_gradients").total[0]
    with torch.no_grad():
        logits = model(ids).logits[0]
        blank = model.transformer.wte(torch.zeros_like(ids))  # token 0 at every position
        handle = model.transformer.wte.register_forward_hook(lambda _m, _a, o: blank)
        base = model(ids).logits[0]
        handle.remove()
    targets = logits.argmax(-1)
    gap = (logits - base).gather(-1, targets[:, None])[:, 0]
    assert ((ig.sum(-1) - gap).abs() <= 1e-2 * gap.abs().clamp(min=1.0)).all(), (ig.sum(-1), gap)
    assert ig.triu(1).abs().max() == 0  # causal
    if kind == "sliding":
        far = torch.ones(6, 6, dtype=torch.bool).tril(-2 * WINDOW - 1)
        assert ig[far].abs().max() == 0


def test_the_baseline_token_is_checked_by_name() -> None:
    model = model_of("llama", "full")
    ids = torch.randint(0, 40, (1, 3))
    with pytest.raises(ArgumentTypeError, match="baseline_id must be a token id"):
        mixing(model, ids, "integrated_gradients", baseline_id=1.0)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=r"baseline_id must be a token id in \[0, 40\)"):
        mixing(model, ids, "integrated_gradients", baseline_id=40)


# -- the encoder of an encoder-decoder, post-norm (through its LayerNorm) and pre-norm -----------


def encoder_decoder(norm_first: bool, kind: str) -> al.Transformer:
    """The encoder-decoder of test_mixing.py with grouped key/value heads and an attention
    kind (its bidirectional form in the encoder)."""
    if kind == "full":
        return seq2seq(norm_first)
    torch.manual_seed(1)
    cfg = al.TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=32, num_heads=4, num_kv_heads=2,
        num_encoder_layers=2, num_decoder_layers=1, d_ff=48, dropout=0.0,
        norm_first=norm_first, max_len=16, **KINDS[kind],
    )  # fmt: skip
    model = al.Transformer(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


ENCODERS = [(n, k) for k in KINDS for n in (False, True)]


@pytest.mark.parametrize(
    ("norm_first", "kind"),
    ENCODERS,
    ids=[f"{'pre' if n else 'post'}_ln-{k}" for n, k in ENCODERS],
)
def test_an_encoders_methods_equal_their_equations(norm_first: bool, kind: str) -> None:
    model = encoder_decoder(norm_first, kind)
    s = 10 if kind == "bigbird" else 6  # 5 blocks of 2: the layout hides some
    src, tgt = torch.randint(3, 30, (2, s)), torch.randint(3, 30, (2, 4))
    kw = dict(layers="encoder.", tgt_in=tgt)
    got = {
        m: mixing(model, src, m, heads=True, **kw)
        for m in ("weights", "rollout", "norm", "norm_residual")
    }
    got["alti"] = mixing(model, src, "alti", **kw)
    got["value_zeroing"] = mixing(
        model, src[:1], "value_zeroing", layers="encoder.", tgt_in=tgt[:1]
    )
    mids: list[torch.Tensor] = []  # LN_1(x + Attn(x)) (post-norm) or x + Attn(LN_1(x))
    handles = [
        enc.hook_resid_mid.register_forward_hook(lambda _m, _a, o: mids.append(o))
        for enc in model.encoder.layers
    ]
    runs, _ = record_layers(model, lambda: model(src, tgt))
    for handle in handles:
        handle.remove()
    close = dict(rtol=1e-10, atol=1e-12)
    alti_layers, rolled = [], []
    for layer, (r, enc) in enumerate(zip(runs, model.encoder.layers)):
        x = r.resid_pre
        vis = visible_by_hand(r, kind, causal=False)
        ref = attention_by_hand(enc.self_attn, enc.norm1(x) if norm_first else x, vis, None)
        a, f = ref["a"], ref["f"]
        torch.testing.assert_close(got["weights"].per_head[layer], a, **close)
        torch.testing.assert_close(got["norm"].per_head[layer], a * f.norm(dim=-1)[:, :, None])
        torch.testing.assert_close(
            got["norm"].per_layer[layer], residual_by_hand(a, f, None).norm(dim=-1), **close
        )
        vec = residual_by_hand(a, f, x)
        y = vec.sum(2) + ref["b_o"]
        if not norm_first:  # LN(Σ_j z_ij + b): each part centred and scaled by the row's σ_i
            ln = enc.norm1
            sigma = (y.var(-1, unbiased=False, keepdim=True) + ln.eps).sqrt()[:, :, None]
            vec = ln.weight * (vec - vec.mean(-1, keepdim=True)) / sigma
            y = ln(y)
        torch.testing.assert_close(y, mids[layer], rtol=0, atol=1e-12)
        torch.testing.assert_close(got["norm_residual"].per_layer[layer], vec.norm(dim=-1), **close)
        c = alti_by_hand(vec, y)
        torch.testing.assert_close(got["alti"].per_layer[layer], c, **close)
        alti_layers.append(c)
        rolled.append(with_identity(a.mean(1)))
        # value zeroing: the encoder layer rerun with token j's values zeroed
        outs = []
        for j in range(s + 1):
            keep = torch.ones(s, 1, dtype=torch.float64)
            keep[j:j + 1] = 0.0  # fmt: skip
            z = a[:1] @ (ref["v"][:1] * keep)
            attn_out = torch.einsum("bhid,hde->bie", z, ref["w_o"]) + ref["b_o"]
            if norm_first:
                h = x[:1] + attn_out
                outs.append(h + enc.ff(enc.norm2(h)))
            else:
                h = enc.norm1(x[:1] + attn_out)
                outs.append(enc.norm2(h + enc.ff(h)))
        expected = cosine_change(torch.stack(outs[:s], 1), outs[s])
        torch.testing.assert_close(got["value_zeroing"].per_layer[layer], expected)
    torch.testing.assert_close(got["rollout"].total, rolled[1] @ rolled[0], **close)
    torch.testing.assert_close(got["alti"].total, alti_layers[1] @ alti_layers[0], **close)
    flow = mixing(model, src[:1], "flow", layers="encoder.", tgt_in=tgt[:1]).total[0]
    expected = torch.minimum(rolled[0][0][None], rolled[1][0][:, :, None]).sum(1)
    torch.testing.assert_close(flow, expected, rtol=1e-8, atol=1e-10)


def test_an_encoder_decoder_refuses_the_gradient_methods_in_one_line() -> None:
    # what they would explain — an output position through layers over the same tokens — an
    # encoder-decoder does not have: a typed error naming the reason, not a shape error
    model = seq2seq(False)
    src, tgt = torch.randint(3, 30, (1, 5)), torch.randint(3, 30, (1, 4))
    for layers in (None, "encoder.", "decoder."):
        with pytest.raises(ArgumentError) as err:
            mixing(model, src, "grad_weights", layers=layers, tgt_in=tgt)
        assert "\n" not in str(err.value)
    with pytest.raises(ArgumentError, match="integrated_gradients needs the token embedding"):
        mixing(model, src, "integrated_gradients", tgt_in=tgt)


def through_norm_by_hand(
    vec: torch.Tensor, y: torch.Tensor, ln: torch.nn.LayerNorm
) -> tuple[torch.Tensor, torch.Tensor]:
    """A post-norm block's parts through ``LN(Σ_j z_ij + b)``: ``γ (z_ij − mean z_ij) / σ_i``."""
    sigma = (y.var(-1, unbiased=False, keepdim=True) + ln.eps).sqrt()[:, :, None]
    return ln.weight * (vec - vec.mean(-1, keepdim=True)) / sigma, ln(y)


@pytest.mark.parametrize(
    ("norm_first", "kind"),
    [(False, "sliding"), (True, "sliding"), (False, "bigbird")],
    ids=["post_ln-sliding", "pre_ln-sliding", "post_ln-bigbird"],
)
def test_alti_plus_with_grouped_heads_and_a_kind_equals_the_blocks_by_hand(
    norm_first: bool, kind: str
) -> None:
    # Ferrando et al. 2022b with one decoder layer: R[i, :S] = Σ_s C^cross[i, s] R_enc[s, :],
    # R[i, S + j] = C^cross[i, res] C^self[i, j]; every block recomputed by hand (the decoder's
    # self-attention causal with the kind, the cross-attention full over the encoder's output)
    model = encoder_decoder(norm_first, kind)
    s, t = (10, 8) if kind == "bigbird" else (6, 5)
    src, tgt = torch.randint(3, 30, (2, s)), torch.randint(3, 30, (2, t))
    got = mixing(model, src, "alti", tgt_in=tgt).total
    memory: list[torch.Tensor] = []
    handle = model.hook_memory.register_forward_hook(lambda _m, _a, o: memory.append(o))
    runs, _ = record_layers(model, lambda: model(src, tgt))
    handle.remove()
    enc = mixing(model, src, "alti", layers="encoder.", tgt_in=tgt).total  # checked above
    own, cross = (
        next(r for r in runs if r.role == role) for role in ("self_attn@decoder", "cross_attn")
    )
    layer = model.decoder.layers[0]
    # the self-attention block
    x = own.resid_pre
    h = layer.norm1(x) if norm_first else x
    ref = attention_by_hand(layer.self_attn, h, visible_by_hand(own, kind), None)
    vec = residual_by_hand(ref["a"], ref["f"], x)
    y = vec.sum(2) + ref["b_o"]
    if not norm_first:
        vec, y = through_norm_by_hand(vec, y, layer.norm1)
    torch.testing.assert_close(y, cross.resid_pre, rtol=0, atol=1e-12)
    c_self = alti_by_hand(vec, y)
    # the cross-attention block: queries from the decoder, keys and values from the memory
    attn, m = layer.cross_attn, memory[0]
    heads, kv, d = attn.num_heads, attn.num_kv_heads, attn.d_head
    w, b = attn.qkv_parameters()
    b = torch.zeros(w.shape[0], dtype=w.dtype) if b is None else b
    h = layer.norm2(y) if norm_first else y
    q = (h @ w[: heads * d].T + b[: heads * d]).view(2, t, heads, d).transpose(1, 2)
    k, v = (m @ w[heads * d :].T + b[heads * d :]).split(kv * d, -1)
    k, v = (z.view(2, s, kv, d).transpose(1, 2).repeat_interleave(heads // kv, 1) for z in (k, v))
    a = (q @ k.transpose(-1, -2) / math.sqrt(d)).softmax(-1)  # cross-attention: always full
    torch.testing.assert_close(cross.weights, a, rtol=1e-10, atol=1e-12)
    b_o = attn.project_out(torch.zeros(1, heads * d, dtype=torch.float64))[0]
    w_o = (attn.project_out(torch.eye(heads * d, dtype=torch.float64)) - b_o).view(heads, d, -1)
    vec = torch.einsum("bhis,bhsd,hde->bise", a, v, w_o)  # T_i(e_s)
    vec = torch.cat([vec, y[:, :, None]], 2)  # and the residual y_i, one more column
    out = vec.sum(2) + b_o
    if not norm_first:
        vec, out = through_norm_by_hand(vec, out, layer.norm2)
    c_cross = alti_by_hand(vec, out)
    expected = torch.cat([c_cross[:, :, :s] @ enc, c_cross[:, :, s:] * c_self], -1)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.sum(-1), torch.ones(2, t, dtype=torch.float64))
