"""Context mixing on the attention kinds without a token × token weight matrix: Linformer through
its effective weights ``A · F`` and Performer through its implied ``D⁻¹ φ(Q) φ(K)ᵀ``, against
float64 references from the layers' parameters and the layers' actual outputs."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab as al
from attnlab.errors import ArgumentError
from attnlab.inspect.mixing import mixing, record_layers
from attnlab.inspect.mixing_rules import token_vectors

# two sources of 7 positions, the second right-padded (pad_id 0) after 4 tokens
SRC = torch.tensor([[5, 6, 7, 8, 9, 10, 2], [13, 14, 15, 2, 0, 0, 0]])
TGT = torch.tensor([[1, 12, 11], [1, 16, 15]])


def linformer_model() -> al.Transformer:
    torch.manual_seed(3)
    cfg = al.TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=1, d_ff=48, dropout=0.0, max_len=12, attention="linformer",
        linformer_k=5,
    )  # fmt: skip
    model = al.Transformer(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    return model


def by_hand(layer: torch.nn.Module, x: torch.Tensor, keep: torch.Tensor) -> dict[str, torch.Tensor]:
    """A Linformer layer from its parameters in float64 (Wang et al. 2020, eq. 7): ``A`` over
    the ``k`` rows of ``E K``, its effective weights ``A F`` over the tokens, and ``f_h(x_t) =
    W_O^h v^h_t`` — hidden keys and values zeroed before the projection."""
    d, h, dh = layer.d_model, layer.num_heads, layer.d_head
    w, b = layer.in_proj_weight.double(), layer.in_proj_bias.double()
    bsz, t, _ = x.shape
    q, k, v = ((x @ w[i * d : (i + 1) * d].T + b[i * d : (i + 1) * d]) for i in range(3))
    q, k, v = (m.view(bsz, t, h, dh).transpose(1, 2) for m in (q, k, v))  # (B, H, T, d_head)
    k = k * keep[:, None, :, None]
    v = v * keep[:, None, :, None]
    e, f = (p.double()[..., :t] for p in layer.projections())  # (H, k, T) or (k, T)
    a = torch.softmax(q @ (e @ k).transpose(-2, -1) / math.sqrt(dh), dim=-1)  # (B, H, T, k)
    af = a @ (f * keep[:, None, None, :])  # Σ_j A_ij F_jt                    (B, H, T, T)
    w_o = layer.out_proj.weight.double()
    fx = torch.stack([v[:, hh] @ w_o[:, hh * dh : (hh + 1) * dh].T for hh in range(h)], 1)
    return {"af": af, "f": fx, "b_o": layer.out_proj.bias.double()}


def _inputs(model: al.Transformer) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Each encoder attention layer's input and output, as the model ran."""
    seen_in: dict[str, torch.Tensor] = {}
    seen_out: dict[str, torch.Tensor] = {}
    handles = []
    for i, layer in enumerate(model.encoder.layers):

        def pre(_m, args, kwargs, i=i):
            seen_in[f"encoder.layers.{i}.self_attn"] = args[0].detach()

        def post(_m, _a, out, i=i):
            seen_out[f"encoder.layers.{i}.self_attn"] = (
                out[0] if isinstance(out, tuple) else out
            ).detach()

        handles.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.self_attn.register_forward_hook(post))
    with torch.no_grad():
        model(SRC, TGT)
    for handle in handles:
        handle.remove()
    return seen_in, seen_out


def test_linformer_mixing_reads_the_effective_weights_and_splits_the_output_exactly() -> None:
    model = linformer_model()
    keep = (SRC != 0).double()
    seen_in, seen_out = _inputs(model)
    weights = mixing(model, SRC, "weights", layers="encoder.", heads=True, tgt_in=TGT)
    norm = mixing(model, SRC, "norm", layers="encoder.", heads=True, tgt_in=TGT)
    for n, name in enumerate(weights.layers):
        layer = model.get_submodule(name)
        ref = by_hand(layer, seen_in[name], keep)
        af, fx = ref["af"], ref["f"]
        assert (af < 0).any()  # signed: F has entries of both signs
        torch.testing.assert_close(weights.per_head[n], af, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(weights.per_layer[n], af.mean(1), rtol=1e-10, atol=1e-12)
        # T_i(x_t) = Σ_h (A F)^h_it W_O^h v^h_t sums, with b_O, to the layer's actual output
        vec = torch.einsum("bhit,bhte->bite", af, fx)
        torch.testing.assert_close(vec.sum(2) + ref["b_o"], seen_out[name], rtol=0, atol=1e-12)
        torch.testing.assert_close(norm.per_layer[n], vec.norm(dim=-1), rtol=1e-10, atol=1e-12)
        per_head = af.abs() * fx.norm(dim=-1)[:, :, None, :]  # ‖α f‖ = |α| ‖f‖
        torch.testing.assert_close(norm.per_head[n], per_head, rtol=1e-10, atol=1e-12)
        # padding takes nothing
        assert norm.per_layer[n][1, :, 4:].abs().max() < 1e-12


def test_linformer_decompositions_rollout_and_flow() -> None:
    model = linformer_model()
    runs, _ = record_layers(model, lambda: model(SRC, TGT))
    enc = [r for r in runs if r.name.startswith("encoder.")]
    for r in enc:  # the residual-aware vectors sum to the stream after the block's attention
        vectors = token_vectors(r.weights, r.values, r.w_out, residual=r.resid_pre)
        torch.testing.assert_close(
            vectors.sum(2) + r.b_out, r.resid_pre + r.attn_out, rtol=0, atol=1e-12
        )
    alti = mixing(model, SRC, "alti", layers="encoder.", tgt_in=TGT)
    torch.testing.assert_close(alti.per_layer.sum(-1), torch.ones(2, 2, 7, dtype=torch.float64))
    # rollout: 0.5 A F + 0.5 I, not renormalised (signed rows), multiplied through the layers
    w = mixing(model, SRC, "weights", layers="encoder.", tgt_in=TGT).per_layer
    eye = torch.eye(7, dtype=torch.float64)
    expected = (0.5 * w[1] + 0.5 * eye) @ (0.5 * w[0] + 0.5 * eye)
    got = mixing(model, SRC, "rollout", layers="encoder.", tgt_in=TGT).total
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    with pytest.raises(ArgumentError, match=r"flow needs non-negative capacities.*A·F"):
        mixing(model, SRC, "flow", layers="encoder.", tgt_in=TGT)
    # value zeroing zeroes a token's value before the projection: padding changes nothing
    vz = mixing(model, SRC, "value_zeroing", layers="encoder.", tgt_in=TGT).per_layer
    assert vz[:, 1, :, 4:].abs().max() < 1e-12
    # ALTI+ through the Linformer encoder: rows sum to 1
    plus = mixing(model, SRC, "alti", tgt_in=TGT).total
    torch.testing.assert_close(plus.sum(-1), torch.ones(2, 3, dtype=torch.float64))
    last = mixing(model, SRC, "alti", rows=-1, tgt_in=TGT)  # rows of the target positions
    assert last.rows.tolist() == [2]
    torch.testing.assert_close(last.total, plus[:, -1:], rtol=0, atol=0)


def test_performer_mixing_reads_its_implied_weights_exactly() -> None:
    # FAVOR+ never forms P = D⁻¹ φ(Q) φ(K)ᵀ, but its output is exactly P V: the decomposition
    # from P sums to the block's actual output (computed by prefix sums)
    torch.manual_seed(0)
    cfg = al.GPTConfig(
        vocab_size=40, n_positions=32, n_embd=32, n_layer=2, n_head=4, attention="performer"
    )
    model = al.GPT(cfg).double().eval()
    ids = torch.randint(0, 40, (2, 9))
    runs, _ = record_layers(model, lambda: model(ids), weights=False)
    recorded, _ = record_layers(model, lambda: model(ids))
    for r, rec in zip(runs, recorded):
        assert r.call.method == "favor" and r.call.weights is None
        p = r.weights  # from the call's features, row block by row block
        torch.testing.assert_close(p, rec.weights, rtol=1e-10, atol=1e-12)  # what the layer returns
        assert (p >= 0).all() and p.triu(1).abs().max() == 0  # causal, non-negative
        torch.testing.assert_close(p.sum(-1), torch.ones_like(p[..., 0]))
        vectors = token_vectors(p, r.values, r.w_out, residual=r.resid_pre)
        torch.testing.assert_close(
            vectors.sum(2) + r.b_out, r.resid_pre + r.attn_out, rtol=0, atol=1e-10
        )
    for method in ("rollout", "norm", "alti", "value_zeroing"):
        m = mixing(model, ids, method)
        got = m.per_layer if m.total is None else m.total
        assert torch.isfinite(got).all(), method
