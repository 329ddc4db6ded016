"""Direct logit attribution: how much each head (each MLP, the embedding, the biases) writes
directly into one logit.

The residual stream a decoder-only model ends with is a sum of what its parts wrote into it
(Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"): the embedding, and per
layer the attention's output — one term a head plus the output projection's bias — and the MLP's,

    h_L = e + Σ_l ( Σ_h z_{l,h} W_O[l, h] + b_O[l] ) + Σ_l MLP_l,

with ``W_O[l, h]`` the columns of the output projection (``c_proj``) that read head ``h``. This
holds as well for a parallel residual (NeoX: ``x + Attention(LN_1(x)) + MLP(LN_2(x))``). The
final norm is linear once its scale is fixed: with the scale ``σ`` computed on the full stream
(TransformerLens's ``apply_ln_to_stack``),

    LayerNorm: LN(h) = γ ⊙ (h − mean(h)) / σ + β,   σ = √(var(h) + ε)
    RMSNorm:   RMS(h) = γ ⊙ h / σ,                   σ = √(mean(h²) + ε)

so each part ``c`` contributes ``(γ ⊙ (c − mean(c)) / σ) · W_U[v]`` (no centring for RMSNorm) to
the logit of token ``v``, and the parts together with the norm's bias, ``β · W_U[v]``, sum to the
logit exactly (to rounding). :func:`direct_logit_attribution` reports them; ``against`` gives the
attribution of a logit difference, ``W_U[v] − W_U[w]``.

A head's *direct* effect is only the path through the unembedding: what it changes in later
layers is not counted (activation patching, :mod:`attnlab.inspect.patching`, measures the total).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.patching import _check_model, _evaluating, _position, _prompt, _record
from attnlab.nn.norms import RMSNorm

__all__ = ["LogitAttribution", "direct_logit_attribution"]


@dataclass(frozen=True)
class LogitAttribution:
    """What each part of a model writes directly into one logit (or a logit difference).

    Attributes:
        token: the token id ``v`` whose logit is attributed.
        against: the token ``w`` subtracted (the attribution of ``logit_v − logit_w``), or ``None``.
        position: the position read (non-negative).
        logit: the model's own logit (or logit difference) there.
        embed: the embedding's part (token and learned position embeddings).
        heads: each head's part, ``(γ ⊙ (z_{l,h} W_O[l,h] − mean) / σ) · W_U[v]``.
        attn_bias: each layer's output-projection bias's part (0 without a bias).
        mlp: each layer's MLP's part (its biases included).
        final_bias: the final norm's bias's part, ``β · W_U[v]`` (0 for RMSNorm).
        scale: ``σ``, the final norm's scale on the full residual stream.

    Shape:
        heads ``(L, H)``; attn_bias, mlp ``(L,)``; float64 on the CPU.
    """

    token: int
    against: int | None
    position: int
    logit: float
    embed: float
    heads: torch.Tensor
    attn_bias: torch.Tensor
    mlp: torch.Tensor
    final_bias: float
    scale: float

    @property
    def total(self) -> float:
        """The sum of every part: the logit, to rounding."""
        return float(
            self.embed + self.heads.sum() + self.attn_bias.sum() + self.mlp.sum() + self.final_bias
        )

    def top(self, k: int = 10) -> list[dict[str, Any]]:
        """The ``k`` heads with the largest direct effect, by absolute value.

        Args:
            k: how many (default 10).

        Returns:
            One dict a head, largest first: ``layer``, ``head``, ``dla``.
        """
        check_positive_int("k", k)
        order = self.heads.abs().flatten().argsort(descending=True)
        h = self.heads.shape[1]
        return [
            {"layer": i // h, "head": i % h, "dla": float(self.heads.flatten()[i])}
            for i in order[:k].tolist()
        ]

    def to_dict(self) -> dict[str, Any]:
        """The attribution as JSON-ready Python values.

        Returns:
            Every field (tensors as lists) and ``total``.
        """
        return {
            "token": self.token,
            "against": self.against,
            "position": self.position,
            "logit": self.logit,
            "total": self.total,
            "embed": self.embed,
            "heads": self.heads.tolist(),
            "attn_bias": self.attn_bias.tolist(),
            "mlp": self.mlp.tolist(),
            "final_bias": self.final_bias,
            "scale": self.scale,
        }


def _token(name: str, token: object, vocab: int) -> int:
    if isinstance(token, bool) or not isinstance(token, int):
        raise ArgumentTypeError(f"{name} must be a token id (int), got {type(token).__name__}")
    if not 0 <= token < vocab:
        raise ArgumentError(f"{name} = {token} is not a token id of a {vocab}-token vocabulary")
    return token


def direct_logit_attribution(
    model: nn.Module,
    input_ids: torch.Tensor,
    token: int,
    *,
    against: int | None = None,
    position: int = -1,
) -> LogitAttribution:
    """Each head's (and the embedding's, each MLP's, the biases') direct part in a logit.

    One forward records the embedding, each layer's per-head outputs ``z`` (``hook_z``), its
    attention and MLP outputs and the final residual stream; then, at ``position`` and with the
    final norm's scale ``σ`` of the full stream, each part ``c`` gives
    ``(γ ⊙ (c − mean(c)) / σ) · u`` with ``u = W_U[token]`` (``W_U[token] − W_U[against]`` with
    ``against``), no centring for RMSNorm. The parts are computed in float64 and sum to the
    model's logit up to the rounding of the model's own dtype.

    Args:
        model: an :class:`attnlab.GPT` (any family); run in eval mode (restored after).
        input_ids: the prompt.
        token: the token id whose logit is attributed.
        against: a token id whose logit is subtracted (attribute ``logit_token − logit_against``),
            or ``None`` (default).
        position: the position read (default ``-1``, the next-token prediction).

    Returns:
        :class:`LogitAttribution`.

    Raises:
        ValueError: a token id outside the vocabulary, a position outside the prompt.
        TypeError: a model that is not an :class:`attnlab.GPT`, or whose attention output
            projection is not a linear layer.

    Shape:
        input_ids ``(T,)`` or ``(1, T)``.

    Examples:
        >>> dla = direct_logit_attribution(model, ids, paris, against=rome)
        >>> dla.top(5), dla.total, dla.logit
    """
    _check_model(model)
    gpt: Any = model  # an attnlab.GPT: its parts by name
    ids = _prompt("input_ids", input_ids, model)
    t = _position("position", position, ids.shape[1])
    blocks = gpt.transformer.h
    n_layer = len(blocks)
    w_u = gpt.lm_head.weight
    vocab = w_u.shape[0]
    v = _token("token", token, vocab)
    w = None if against is None else _token("against", against, vocab)
    projections = []
    for layer in range(n_layer):
        proj = getattr(blocks[layer].attn, "c_proj", None)
        if not isinstance(proj, nn.Linear):
            raise ArgumentTypeError(
                f"layer {layer}'s attention has no linear output projection c_proj "
                f"({type(blocks[layer].attn).__name__}), so its heads cannot be separated"
            )
        projections.append(proj)
    names = ["transformer.h.0.hook_resid_pre", f"transformer.h.{n_layer - 1}.hook_resid_post"]
    for layer in range(n_layer):
        names += [f"transformer.h.{layer}.{n}" for n in ("attn.hook_z", "hook_mlp_out")]
    with _evaluating(model):
        logits, acts = _record(model, ids, names)
    f64 = torch.float64
    # u = W_U[v] (− W_U[w]);  the logit (difference) the model computed
    u = w_u[v].detach().to(f64)
    logit = float(logits[0, t, v])
    if w is not None:
        u = u - w_u[w].detach().to(f64)
        logit -= float(logits[0, t, w])
    bias = gpt.lm_head.bias
    unembed_bias = 0.0 if bias is None else float(bias[v] - (0.0 if w is None else bias[w]))

    ln_f = gpt.transformer.ln_f
    rms = isinstance(ln_f, RMSNorm)
    if not rms and not isinstance(ln_f, nn.LayerNorm):
        raise ArgumentTypeError(
            f"the final norm must be a LayerNorm or an RMSNorm, got {type(ln_f).__name__}"
        )
    h_final = acts[names[1]][0, t].to(f64)  # (d_model,)
    d = h_final.shape[0]
    if rms:  # σ = √(mean(h²) + ε)
        sigma = math.sqrt(float(h_final.pow(2).mean()) + ln_f.eps)
    else:  # σ = √(var(h) + ε), the biased variance
        sigma = math.sqrt(float(h_final.var(unbiased=False)) + ln_f.eps)
    gamma = torch.ones(d, dtype=f64) if ln_f.weight is None else ln_f.weight.detach().to(f64)
    beta = getattr(ln_f, "bias", None)
    # the direction each part is read along: c ↦ (γ ⊙ (c − mean(c)) / σ) · u
    direction = (gamma * u.to(gamma.device)) / sigma  # (d_model,)
    if not rms:  # (c − mean(c)) · g = c · (g − mean(g))
        direction = direction - direction.mean()

    def part(c: torch.Tensor) -> torch.Tensor:
        return c.to(f64) @ direction.to(c.device)

    embed = float(part(acts[names[0]][0, t]))
    heads = []
    attn_bias = torch.zeros(n_layer, dtype=f64)
    mlp = torch.zeros(n_layer, dtype=f64)
    for layer, proj in enumerate(projections):
        z = acts[f"transformer.h.{layer}.attn.hook_z"][0, :, t].to(f64)  # (H, d_head)
        n_heads, d_head = z.shape
        w_o = proj.weight.detach().to(f64).view(d, n_heads, d_head)  # W_O[:, h·d_head + j]
        # head h writes z_h W_O[h]ᵀ: its d_head columns of c_proj           (H, d_model)
        writes = torch.einsum("hj,mhj->hm", z, w_o)
        heads.append(part(writes).cpu())
        if proj.bias is not None:
            attn_bias[layer] = float(part(proj.bias.detach()))
        mlp[layer] = float(part(acts[f"transformer.h.{layer}.hook_mlp_out"][0, t]))
    final_bias = unembed_bias
    if beta is not None:  # β · u
        final_bias += float(beta.detach().to(f64) @ u.to(beta.device))
    width = max(x.shape[0] for x in heads)
    head_parts = torch.full((n_layer, width), math.nan, dtype=f64)
    for layer, x in enumerate(heads):
        head_parts[layer, : x.shape[0]] = x
    return LogitAttribution(
        token=v,
        against=w,
        position=t,
        logit=logit,
        embed=embed,
        heads=head_parts,
        attn_bias=attn_bias,
        mlp=mlp,
        final_bias=final_bias,
        scale=sigma,
    )
