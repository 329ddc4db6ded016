"""Context mixing (attnlab.inspect.mixing) against float64 references written from each paper's
equations, on every family's block structure and on the attention kinds that hide keys."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab as al
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.mixing import METHODS, mixing, record_layers
from attnlab.inspect.mixing_rules import (
    MAX_FLOW_LENGTH,
    alti_contributions,
    max_flow,
    rollout,
    token_vectors,
)
from attnlab.nn.kinds import BigBirdSpec, SlidingSpec

FAMILIES = {
    "gpt2": {},
    "llama": dict(positions="rope", num_kv_heads=2, norm="rmsnorm", mlp="gated", bias=False),
    "neox": dict(positions="rope", parallel_residual=True, rotary_dim=4),
    "alibi": dict(positions="alibi"),
}


def tiny(seed: int = 0, n_layer: int = 2, **extra: object) -> al.GPT:
    torch.manual_seed(seed)
    cfg = al.GPTConfig(vocab_size=40, n_positions=32, n_embd=32, n_layer=n_layer, n_head=4, **extra)
    model = al.GPT(cfg).double().eval()
    with torch.no_grad():  # sharper weights than the initialisation, so the methods disagree
        for p in model.parameters():
            p.mul_(3.0)
    return model


# -- references, from the equations, on the model's own parameters ------------------------------


def reference_layer(model: al.GPT, ids: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    """x, the weights and the per-head value-output vectors of one block, by hand in float64."""
    x = model.transformer.wte(ids)
    if model.transformer.wpe is not None:
        x = x + model.transformer.wpe.weight[: ids.shape[1]]
    t = ids.shape[1]
    alibi = model.config.positions == "alibi"
    h = model.config.n_head
    bias = al.nn.positional.alibi_bias(h, t, t, dtype=torch.float64) if alibi else None
    for block in model.transformer.h[:layer]:  # the layers before: the model's own blocks
        x = block(x, bias)
    block = model.transformer.h[layer]
    attn = block.attn
    hk, d = attn.num_kv_heads, attn.d_head
    w, b = attn.qkv_parameters()
    ln = block.ln_1(x)
    qkv = ln @ w.T + (0 if b is None else b)
    q, k, v = qkv.split([h * d, hk * d, hk * d], -1)
    q = q.view(-1, t, h, d).transpose(1, 2)
    k = k.view(-1, t, hk, d).transpose(1, 2)
    v = v.view(-1, t, hk, d).transpose(1, 2)
    if attn.rotary is not None:
        pos = torch.arange(t)
        q, k = attn.rotary(q, pos), attn.rotary(k, pos)
    k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if bias is not None:  # ALiBi: −m_h (i − j)
        s = s + bias
    s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    a = s.softmax(-1)
    w_o = attn.c_proj.weight if hasattr(attn, "c_proj") else attn.out_proj.weight
    f = torch.stack([v[:, hh] @ w_o[:, hh * d : (hh + 1) * d].T for hh in range(h)], 1)
    return {"x": x, "a": a, "f": f}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_token_vectors_sum_to_the_layers_output(family: str) -> None:
    # Kobayashi et al.: Σ_j T_i(x_j) + b_O is the residual stream after attention, exactly
    model = tiny(**FAMILIES[family])
    ids = torch.randint(0, 40, (2, 9))
    runs, _ = record_layers(model, lambda: model(ids))
    for r in runs:
        vectors = token_vectors(r.weights, r.call.v, r.w_out, residual=r.resid_pre)
        torch.testing.assert_close(
            vectors.sum(2) + r.b_out, r.resid_pre + r.attn_out, rtol=0, atol=1e-12
        )


@pytest.mark.parametrize("family", list(FAMILIES))
def test_norm_and_alti_equal_the_equations_by_hand(family: str) -> None:
    model = tiny(**FAMILIES[family])
    ids = torch.randint(0, 40, (1, 8))
    norm = mixing(model, ids, "norm", heads=True)
    alti = mixing(model, ids, "alti")
    res = mixing(model, ids, "norm_residual")
    layers_c = []
    for layer in range(2):
        ref = reference_layer(model, ids, layer)
        a, f, x = ref["a"], ref["f"], ref["x"]
        # per head: ‖α^h_ij f_h(x_j)‖; summed: ‖Σ_h α^h_ij f_h(x_j)‖
        per_head = a * f.norm(dim=-1)[:, :, None, :]
        torch.testing.assert_close(norm.per_head[layer], per_head, rtol=1e-10, atol=1e-12)
        t = ids.shape[1]
        vec = torch.zeros(1, t, t, x.shape[-1], dtype=torch.float64)
        for i in range(t):
            for j in range(t):
                vec[0, i, j] = sum(a[0, hh, i, j] * f[0, hh, j] for hh in range(a.shape[1]))
        torch.testing.assert_close(norm.per_layer[layer], vec.norm(dim=-1), rtol=1e-10, atol=1e-12)
        for i in range(t):
            vec[0, i, i] += x[0, i]
        torch.testing.assert_close(res.per_layer[layer], vec.norm(dim=-1), rtol=1e-10, atol=1e-12)
        # ALTI: y_i = Σ_j T_i(x_j) + b_O; c_ij ∝ max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)
        attn = model.transformer.h[layer].attn
        b_o = attn.project_out(torch.zeros(1, 32, dtype=torch.float64))[0]
        y = vec.sum(2) + b_o
        c = torch.zeros(1, t, t, dtype=torch.float64)
        for i in range(t):
            for j in range(t):
                c[0, i, j] = max(0.0, y[0, i].abs().sum() - (y[0, i] - vec[0, i, j]).abs().sum())
            c[0, i] /= c[0, i].sum()
        torch.testing.assert_close(alti.per_layer[layer], c, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(c.sum(-1), torch.ones(1, t, dtype=torch.float64))
        layers_c.append(c)
    torch.testing.assert_close(alti.total, layers_c[1] @ layers_c[0], rtol=1e-10, atol=1e-12)
    # rolled out layer by layer: layer 0's own contributions, then the product up to layer 1
    torch.testing.assert_close(alti.cumulative[0], layers_c[0], rtol=1e-10, atol=1e-12)
    assert torch.equal(alti.cumulative[-1], alti.total)


def test_rollout_of_identity_layers_is_the_identity() -> None:
    eye = torch.eye(5, dtype=torch.float64).expand(2, 5, 5)
    torch.testing.assert_close(rollout([eye, eye, eye]), eye)


def test_rollout_and_flow_match_the_equations() -> None:
    model = tiny()
    ids = torch.randint(0, 40, (1, 6))
    out = mixing(model, ids, "rollout")
    w = mixing(model, ids, "weights").per_layer  # (L, B, T, T), head means
    eye = torch.eye(6, dtype=torch.float64)
    r = eye
    for layer, a in enumerate(w[:, 0]):
        m = 0.5 * a + 0.5 * eye
        r = (m / m.sum(-1, keepdim=True)) @ r
        # the product up to layer l
        torch.testing.assert_close(out.cumulative[layer, 0], r, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(out.total[0], r, rtol=1e-12, atol=1e-14)
    assert torch.equal(out.cumulative[-1], out.total)
    # one layer: the only path from j to i is the edge itself, of capacity Ã[i, j]
    one = max_flow([w[0]])
    m = 0.5 * w[0] + 0.5 * eye
    torch.testing.assert_close(one, m / m.sum(-1, keepdim=True), rtol=1e-9, atol=1e-12)
    # two layers: the flow is bounded by every cut (here: the edges into i, the edges out of j)
    two = mixing(model, ids, "flow").total[0]
    m1 = 0.5 * w[0, 0] + 0.5 * eye
    m2 = 0.5 * w[1, 0] + 0.5 * eye
    m1, m2 = m1 / m1.sum(-1, keepdim=True), m2 / m2.sum(-1, keepdim=True)
    assert (two <= m2.sum(-1, keepdim=True) + 1e-9).all()
    assert (two <= m1.sum(0)[None, :] + 1e-9).all()
    assert (two >= out.total[0] - 1e-9).all()  # one path's bottleneck ≥ the product along it


def test_flow_equals_a_fresh_maximum_flow_per_pair() -> None:
    """max_flow reuses one residual network and skips pairs no path joins; each value must be
    networkx's default maximum flow on a graph built for that pair alone."""
    import networkx as nx

    g = torch.Generator().manual_seed(0)
    t, layers = 7, 3
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    mats = []
    for _ in range(layers):
        a = torch.rand(2, t, t, generator=g, dtype=torch.float64)
        a[1] = a[1] * causal  # row 0 attends everywhere, row 1 causally: no path from j > i
        mats.append(a / a.sum(-1, keepdim=True))
    got = max_flow(mats)
    want = torch.zeros(2, t, t, dtype=torch.float64)
    for row in range(2):
        graph = nx.DiGraph()
        for layer, a in enumerate(mats, start=1):
            m = 0.5 * a[row] + 0.5 * torch.eye(t, dtype=torch.float64)
            m = m / m.sum(-1, keepdim=True)
            for i in range(t):
                for j in range(t):
                    if m[i, j] > 0:
                        graph.add_edge((layer - 1, j), (layer, i), capacity=float(m[i, j]))
        for i in range(t):
            for j in range(t):
                want[row, i, j] = nx.maximum_flow_value(graph, (0, j), (layers, i))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert (got[0] > 0).all() and (got[1, ~causal] == 0).all() and (got[1, causal] > 0).all()


def test_flow_refuses_long_inputs_in_one_line() -> None:
    a = torch.full((1, MAX_FLOW_LENGTH + 1, MAX_FLOW_LENGTH + 1), 0.5, dtype=torch.float64)
    with pytest.raises(ArgumentError, match=f"at most {MAX_FLOW_LENGTH} tokens"):
        max_flow([a])


def test_alti_rows_sum_to_one_and_a_lone_token_keeps_itself() -> None:
    vectors = torch.zeros(1, 2, 2, 3, dtype=torch.float64)
    vectors[0, 0, 0] = torch.tensor([1.0, 2.0, 3.0])
    vectors[0, 1, 0] = torch.tensor([1.0, 0.0, 0.0])
    vectors[0, 1, 1] = torch.tensor([0.0, 1.0, 0.0])
    c = alti_contributions(vectors, vectors.sum(2))
    torch.testing.assert_close(c[0, 0], torch.tensor([1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(c[0, 1], torch.tensor([0.5, 0.5], dtype=torch.float64))


def test_value_zeroing_of_a_token_no_one_sees_changes_nothing() -> None:
    model = tiny()
    ids = torch.randint(0, 40, (1, 7))
    keep = torch.ones(1, 7, dtype=torch.long)
    keep[0, 2] = 0  # padding: no query may attend to token 2
    vz = mixing(model, ids, "value_zeroing", attention_mask=keep)
    assert vz.per_layer.shape == (2, 1, 7, 7)
    assert vz.per_layer[:, 0, :, 2].abs().max() < 1e-12
    # causal: a token changes nothing before it; each row's changes sum to 1
    later = torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert vz.per_layer[:, 0][:, later].abs().max() < 1e-12
    torch.testing.assert_close(vz.per_layer.sum(-1), torch.ones(2, 1, 7, dtype=torch.float64))


def test_grad_weights_reads_the_gradient_with_respect_to_the_weights_used() -> None:
    # reference: the same model on the math backend, whose returned weights are the tensor that
    # multiplies V, so autograd gives ∂s/∂A directly
    model = tiny(**FAMILIES["llama"])
    ids = torch.randint(0, 40, (1, 6))
    out = mixing(model, ids, "grad_weights")
    got = out.total
    assert out.cumulative is not None and out.cumulative[-1] is not None
    assert torch.equal(out.cumulative[-1], got)  # the last layer's R is the total
    ref_model = tiny(**FAMILIES["llama"], backend="math")
    kept: list[torch.Tensor] = []
    handles = [
        b.attn.hook_weights.register_forward_hook(lambda _m, _a, w: kept.append(w))
        for b in ref_model.transformer.h
    ]
    logits = ref_model(ids).logits
    for h in handles:
        h.remove()
    targets = logits.argmax(-1)
    t = ids.shape[1]
    for i in range(t):
        grads = torch.autograd.grad(logits[0, i, targets[0, i]], kept, retain_graph=True)
        r = torch.eye(t, dtype=torch.float64)
        for layer, (a, g) in enumerate(zip(kept, grads)):
            r = r + (g * a).clamp(min=0).mean(1)[0] @ r
            # R after layer l: the relevance through layers 0 … l
            torch.testing.assert_close(
                out.cumulative[layer, 0, i], r[i].detach(), rtol=1e-9, atol=1e-12
            )
        torch.testing.assert_close(got[0, i], r[i].detach(), rtol=1e-9, atol=1e-12)


def test_integrated_gradients_are_complete() -> None:
    # Sundararajan et al.'s completeness: the attributions sum to f(x) − f(baseline), the
    # baseline being token 0's embedding at every position
    model = tiny(n_layer=1)
    ids = torch.randint(0, 40, (1, 4))
    ig = mixing(model, ids, "integrated_gradients").total
    with torch.no_grad():
        logits = model(ids).logits
    targets = logits.argmax(-1)
    blank = model.transformer.wte(torch.zeros_like(ids))  # the baseline: token 0 everywhere
    handle = model.transformer.wte.register_forward_hook(lambda _m, _a, o: blank)
    with torch.no_grad():
        base = model(ids).logits
    handle.remove()
    for i in range(4):
        gap = float(logits[0, i, targets[0, i]] - base[0, i, targets[0, i]])
        assert abs(float(ig[0, i].sum()) - gap) < 2e-2 * max(1.0, abs(gap))
    assert ig[0].triu(1).abs().max() < 1e-12  # causal: later tokens get nothing


@pytest.mark.parametrize(
    "spec", [SlidingSpec(window=2), BigBirdSpec(block_size=2, num_random_blocks=1)]
)
def test_hidden_keys_take_nothing(spec: object) -> None:
    model = tiny(attention=spec)
    ids = torch.randint(0, 40, (1, 8))
    runs, _ = record_layers(model, lambda: model(ids))
    hidden = ~runs[0].call.visible()[0, 0]  # (T, T): the window's band / the layout's blocks
    assert hidden.any()
    for method in ("weights", "norm", "value_zeroing"):
        per_layer = mixing(model, ids, method).per_layer
        assert per_layer[0, 0][hidden].abs().max() < 1e-12, method


def test_bad_input_is_refused_by_name() -> None:
    model = tiny(n_layer=1)
    with pytest.raises(ArgumentError, match="method must be one of"):
        mixing(model, torch.zeros(1, 3, dtype=torch.long), "attention")
    with pytest.raises(ArgumentTypeError, match="input_ids must be an integer tensor"):
        mixing(model, torch.zeros(1, 3), "rollout")
    assert "alti" in METHODS and "integrated_gradients" in METHODS


def seq2seq(norm_first: bool) -> al.Transformer:
    torch.manual_seed(1)
    cfg = al.TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=1, d_ff=48, dropout=0.0, norm_first=norm_first, max_len=16,
    )  # fmt: skip
    model = al.Transformer(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


@pytest.mark.parametrize("norm_first", [False, True])
def test_an_encoders_decomposition_goes_through_its_layer_norm(norm_first: bool) -> None:
    # Kobayashi et al. 2021: LN(Σ_j z_ij + b) = Σ_j γ(z_ij − mean z_ij)/σ_i + γ(b − mean b)/σ_i + β
    model = seq2seq(norm_first)
    src = torch.randint(3, 30, (2, 7))
    tgt = torch.randint(3, 30, (2, 5))
    runs, _ = record_layers(model, lambda: model(src, tgt))
    enc = [r for r in runs if r.name.startswith("encoder.")]
    assert len(enc) == 2 and all((r.post_norm is None) == norm_first for r in enc)
    from attnlab.inspect.mixing_rules import through_layer_norm

    mids: list[torch.Tensor] = []
    handles = [
        layer.hook_resid_mid.register_forward_hook(lambda _m, _a, o: mids.append(o))
        for layer in model.encoder.layers
    ]
    model(src, tgt)
    for h in handles:
        h.remove()
    for r, mid in zip(enc, mids):
        vectors = token_vectors(r.weights, r.call.v, r.w_out, residual=r.resid_pre)
        if r.post_norm is None:
            torch.testing.assert_close(vectors.sum(2) + r.b_out, mid, rtol=0, atol=1e-12)
        else:
            after, y = through_layer_norm(vectors, r.b_out, r.post_norm)
            torch.testing.assert_close(y, mid, rtol=0, atol=1e-12)
            gamma, beta = r.post_norm.weight, r.post_norm.bias
            sigma = ((vectors.sum(2) + r.b_out).var(-1, unbiased=False) + 1e-5).sqrt()
            bias_part = gamma * (r.b_out - r.b_out.mean()) / sigma[..., None] + beta
            torch.testing.assert_close(after.sum(2) + bias_part, mid, rtol=0, atol=1e-12)
    alti = mixing(model, src, "alti", layers="encoder.", tgt_in=tgt)
    assert alti.layers == [r.name for r in enc]
    # no autograd graph is kept through the LayerNorm's parameters (a result, not a graph)
    assert not alti.per_layer.requires_grad and not alti.total.requires_grad
    torch.testing.assert_close(alti.per_layer.sum(-1), torch.ones(2, 2, 7, dtype=torch.float64))
    rolled = mixing(model, src, "rollout", layers="encoder.", tgt_in=tgt)
    torch.testing.assert_close(rolled.total.sum(-1), torch.ones(2, 7, dtype=torch.float64))


def test_an_encoder_decoder_needs_one_stack() -> None:
    model = seq2seq(False)
    src, tgt = torch.randint(3, 30, (1, 6)), torch.randint(3, 30, (1, 4))
    with pytest.raises(ArgumentError, match="choose one stack with layers="):
        mixing(model, src, "rollout", tgt_in=tgt)
    with pytest.raises(ArgumentError, match="selects no attention layer"):
        mixing(model, src, "rollout", layers="nowhere.", tgt_in=tgt)
    with pytest.raises(ArgumentError, match="cross-attention, mixes two sequences"):
        mixing(model, src, "value_zeroing", tgt_in=tgt)
    vz = mixing(model, src, "value_zeroing", layers="encoder.", tgt_in=tgt)
    assert vz.per_layer.shape == (2, 1, 6, 6)


def test_a_length_past_the_memory_is_refused_before_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import attnlab._budget as budget
    from attnlab.inspect.mixing import mixing_bytes

    model = tiny(n_layer=2)
    ids = torch.randint(0, 40, (1, 8))
    need = mixing_bytes(model, "alti", 1, 8)
    # recorded: L·B·T·(3·d + 2·H·d_head + 3·H_kv·d_head) (no logits: it stops early); result
    # L·B·T² + L·B·T² (each layer's rollout); one block of 8 rows, B·b·T·(2·H + 3·d), and f,
    # B·H·T·d
    recorded = 2 * 8 * (3 * 32 + 2 * 32 + 3 * 32)
    assert need == (recorded + 2 * 64 + 2 * 64 + 8 * 8 * (8 + 96) + 4 * 8 * 32) * 8
    monkeypatch.setattr(budget, "available_memory", lambda device=None: need - 1)
    with pytest.raises(ArgumentError, match=r"input_ids of 8 tokens \(T = 8\) needs about"):
        mixing(model, ids, "alti")


@pytest.mark.parametrize("norm_first", [False, True])
def test_alti_plus_follows_source_and_target_through_the_decoder(norm_first: bool) -> None:
    # Ferrando et al. 2022b: R^l[i, :S] = Σ_s C^cross[i, s] R_enc[s] + C^cross[i, res] (C^self R)[i, :S]
    model = seq2seq(norm_first)
    src, tgt = torch.randint(3, 30, (2, 6)), torch.randint(3, 30, (2, 4))
    got = mixing(model, src, "alti", tgt_in=tgt)
    assert got.total.shape == (2, 4, 6 + 4)
    torch.testing.assert_close(got.total.sum(-1), torch.ones(2, 4, dtype=torch.float64))
    enc = mixing(model, src, "alti", layers="encoder.", tgt_in=tgt).total
    runs, _ = record_layers(model, lambda: model(src, tgt))
    from attnlab.inspect.mixing_rules import alti_contributions, through_layer_norm

    cross = next(r for r in runs if r.role == "cross_attn")
    own = next(r for r in runs if r.role == "self_attn@decoder")
    # the cross block by hand: T_i(e_s) = Σ_h α^h_is W_O^h v^h_s, and the residual y_i itself
    a, v = cross.weights, cross.call.v.repeat_interleave(1, 1)
    vec = torch.zeros(2, 4, 7, 32, dtype=torch.float64)
    for i in range(4):
        for s_ in range(6):
            vec[:, i, s_] = sum(
                a[:, h, i, s_, None] * (cross.w_out[h] @ v[:, h, s_].T).T for h in range(4)
            )
        vec[:, i, 6] = cross.resid_pre[:, i]
    y = cross.resid_pre + cross.attn_out
    if cross.post_norm is not None:
        vec, y = through_layer_norm(vec, cross.b_out, cross.post_norm)
    else:  # exact: the parts and the bias are the block's output
        torch.testing.assert_close(vec.sum(2) + cross.b_out, y, rtol=0, atol=1e-12)
    c_cross = alti_contributions(vec, y, own=6)
    self_vec = token_vectors(own.weights, own.call.v, own.w_out, residual=own.resid_pre)
    y_self = own.resid_pre + own.attn_out
    if own.post_norm is not None:
        self_vec, y_self = through_layer_norm(self_vec, own.b_out, own.post_norm)
    c_self = alti_contributions(self_vec, y_self)
    expected = torch.zeros(2, 4, 10, dtype=torch.float64)
    for i in range(4):
        for j in range(4):  # the residual's share, through the self block: target token j
            expected[:, i, 6 + j] = c_cross[:, i, 6] * c_self[:, i, j]
        expected[:, i, :6] = (c_cross[:, i, :6, None] * enc).sum(1)
    torch.testing.assert_close(got.total, expected, rtol=1e-10, atol=1e-12)
