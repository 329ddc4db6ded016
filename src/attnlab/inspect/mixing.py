"""Context mixing: what each token really takes from the others, by several methods, one API.

Raw attention weights say where a head looks, not what it moves: a weight of 0.99 on a first
token whose value vector is nearly zero moves nothing (Kobayashi et al. 2020), and after a few
layers every position is a mixture of all tokens (Abnar & Zuidema 2020). :func:`mixing` gives,
for every attention layer of a model, a ``T_q × T_k`` matrix of how much each output position
takes from each input position, by the method asked for:

========================  =====================================================================
``"weights"``             the weights ``A`` (mean over heads; per head too)
``"rollout"``             ``Ã_l = 0.5 A_l + 0.5 I`` multiplied through the layers (Abnar & Zuidema)
``"flow"``                maximum flow through the layer graph (Abnar & Zuidema; networkx)
``"norm"``                ``‖α_ij f(x_j)‖``, ``f`` the value and output projections (Kobayashi 2020)
``"norm_residual"``       ``‖T_i(x_j)‖`` with the residual stream (Kobayashi et al. 2021)
``"alti"``                distance-based contributions through attention and residual, rolled out
                          across layers (Ferrando et al. 2022)
``"value_zeroing"``       zero token ``j``'s value, measure the cosine change of each output
                          (Mohebbi et al. 2023) — :mod:`attnlab.inspect.mixing_causal`
``"grad_weights"``        ``E_h[(∇A ⊙ A)^+]`` rolled out (Chefer et al. 2021)
``"integrated_gradients"``  Captum's integrated gradients on the token embeddings
========================  =====================================================================

Every method reads what the layer computed (its resolved call, ``hook_call``: the weights, the
values, the masking) and the layer's own ``W_O``: nothing is recomputed. A window or a BigBird
layout gives zero weight to the keys it hides, so every method sees the layout. The decompositions
(``norm``, ``norm_residual``, ``alti``) are exact for pre-norm blocks (GPT-2, Llama, Mistral,
Qwen2, NeoX's parallel residual): ``LN_1(x_j)`` depends on ``x_j`` alone, so
``Σ_j T_i(x_j) + b_O`` is the block's residual stream after attention, ``x_i + Attn(LN_1(x))_i``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import nn

from attnlab._budget import check_fits
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.capture import attention_modules
from attnlab.inspect.mixing_rules import (
    alti_contributions,
    alti_plus,
    max_flow,
    rollout,
    through_layer_norm,
    token_vectors,
)
from attnlab.inspect.qk_circuits import head_weights
from attnlab.nn.resolved_call import ResolvedCall

__all__ = ["METHODS", "LayerRun", "Mixing", "mixing", "mixing_bytes", "record_layers"]

Method = Literal[
    "weights",
    "rollout",
    "flow",
    "norm",
    "norm_residual",
    "alti",
    "value_zeroing",
    "grad_weights",
    "integrated_gradients",
]
#: every method :func:`mixing` knows, in the order of the table above
METHODS: tuple[str, ...] = get_args(Method)

#: what one number of each method means (a figure's colour bar)
MEANING: dict[str, str] = {
    "weights": "attention weight (mean over heads)",
    "rollout": "rolled-out attention (share of token j in position i)",
    "flow": "maximum attention flow from token j to position i",
    "norm": "‖Σ_h α_ij f_h(x_j)‖ (norm of what j adds)",
    "norm_residual": "‖T_i(x_j)‖ (norm with the residual)",
    "alti": "ALTI contribution (share of token j in position i)",
    "value_zeroing": "value-zeroing contribution (share of the change)",
    "grad_weights": "gradient-weighted relevance of token j for position i",
    "integrated_gradients": "integrated-gradients attribution of token j",
}


@dataclass(frozen=True, eq=False)
class LayerRun:
    """One attention layer as it ran inside its block (read from its hook points).

    Attributes:
        name: the attention module's path.
        call: its resolved call (weights included).
        resid_pre: the residual stream entering the block, ``x``; ``None`` outside a block
            that exposes one.
        attn_out: what the attention added to the residual stream; ``None`` likewise.
        w_out: ``W_O`` per head.
        b_out: the output projection's bias (zeros when it has none).
        post_norm: the LayerNorm applied after the residual connection of a post-norm block
            (Vaswani et al.'s, BERT's), or ``None`` for a pre-norm block.
        role: where the layer sits: ``"attn"`` (a GPT block), ``"self_attn"`` (an encoder
            layer), ``"self_attn@decoder"`` or ``"cross_attn"`` (a decoder layer).

    Shape:
        resid_pre, attn_out ``(B, T, d_model)``; w_out ``(H, d_model, d_head)``; b_out
        ``(d_model,)``.
    """

    name: str
    call: ResolvedCall
    resid_pre: torch.Tensor | None
    attn_out: torch.Tensor | None
    w_out: torch.Tensor
    b_out: torch.Tensor
    post_norm: nn.LayerNorm | None = None
    role: str = "attn"

    @property
    def weights(self) -> torch.Tensor:
        """The weights of every query head, ``(B, H, T_q, T_k)``."""
        if self.call.weights is None:  # the recording asks for them: never None there
            raise ArgumentError(f"{self.name} ran without weights")
        return self.call.weights


@dataclass(frozen=True, eq=False)
class Mixing:
    """Context-mixing scores of one input (:func:`mixing`).

    Attributes:
        method: the method's name.
        meaning: what one number means (for a colour bar).
        layers: the attention layers, in the order they ran.
        per_layer: each layer's matrix (what its outputs take from its inputs).
        per_head: the same per head where the method defines it (``weights``, ``norm``), else
            ``None``.
        total: through every layer (``rollout``, ``flow``, ``alti``, ``grad_weights``,
            ``integrated_gradients``): what the last layer's outputs take from the input
            tokens; ``None`` for the per-layer methods.

    Shape:
        per_layer ``(L, B, T_q, T_k)``; per_head ``(L, B, H, T_q, T_k)``; total ``(B, T, T)``.
    """

    method: str
    meaning: str
    layers: list[str]
    per_layer: torch.Tensor | None
    per_head: torch.Tensor | None = None
    total: torch.Tensor | None = None


def record_layers(
    model: nn.Module, forward: Callable[[], Any], *, grad: bool = False
) -> tuple[list[LayerRun], Any]:
    """Run ``forward()`` once and record every attention layer's resolved call (with its
    weights), the residual stream entering its block and what it added.

    Args:
        model: any module with :class:`~attnlab.nn.multihead.MultiHeadAttention` layers.
        forward: runs ``model`` once.
        grad: keep the autograd graph (for the gradient methods); else under ``no_grad``.

    Returns:
        ``(layers in execution order, forward's output)``.

    Raises:
        ValueError: the model has no attention layer, or ``forward`` ran none.
    """
    modules = attention_modules(model)
    if not modules:
        raise ArgumentError(f"model ({type(model).__name__}) has no attention layer")
    parents = {n: m for n, m in model.named_modules()}
    seen: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    handles = []

    def keep(name: str, key: str) -> Callable[..., None]:
        def hook(_mod: nn.Module, _args: Any, out: Any) -> None:
            if key == "call" and name not in order:
                order.append(name)
            seen.setdefault(name, {}).setdefault(key, out)  # the first call of each layer

        return hook

    try:
        for name, attn in modules.items():
            handles.append(attn.hook_weights.register_forward_hook(lambda *_: None))
            handles.append(attn.hook_call.register_forward_hook(keep(name, "call")))
            block, role = _block_of(parents, name)
            for key, point in zip(("resid_pre", "attn_out"), _STREAM[role][:2]):
                hp = getattr(block, point, None)
                if isinstance(hp, nn.Module):
                    handles.append(hp.register_forward_hook(keep(name, key)))
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            out = forward()
    finally:
        for h in handles:
            h.remove()
    if not order:
        raise ArgumentError("forward ran no attention layer of the model")
    runs = []
    for name in order:
        attn = modules[name]
        block, role = _block_of(parents, name)
        norm = getattr(block, _STREAM[role][2], None)
        post_norm = norm if isinstance(norm, nn.LayerNorm) and not block.norm_first else None
        w = head_weights(attn).output
        z0 = torch.zeros(1, attn.num_heads * attn.d_head, dtype=w.dtype, device=w.device)
        with torch.no_grad():
            b_out = attn.project_out(z0)[0]  # b_O (zeros without a bias): W_O · 0 + b_O
        runs.append(
            LayerRun(
                name,
                seen[name]["call"],
                seen[name].get("resid_pre"),
                seen[name].get("attn_out"),
                w,
                b_out,
                post_norm,
                role,
            )
        )
    return runs, out


#: where a block's attention reads and writes the residual stream, by the attribute that holds
#: it: the stream entering it, what it adds, and the norm after it in a post-norm block
_STREAM = {
    "attn": ("hook_resid_pre", "hook_attn_out", ""),  # GPTBlock (always pre-norm)
    "self_attn": ("hook_resid_pre", "hook_attn_out", "norm1"),  # EncoderLayer
    "self_attn@decoder": ("hook_resid_pre", "hook_self_attn_out", "norm1"),  # DecoderLayer
    "cross_attn": ("hook_resid_mid", "hook_cross_attn_out", "norm2"),
}


def _block_of(parents: dict[str, nn.Module], name: str) -> tuple[Any, str]:
    """The block around an attention layer and the layer's role in it (a key of ``_STREAM``)."""
    parent, _, attr = name.rpartition(".")
    block = parents.get(parent) if parent else None
    role = attr if attr in _STREAM else "attn"
    if role == "self_attn" and hasattr(block, "cross_attn"):
        role = "self_attn@decoder"
    return block, role


def mixing(
    model: nn.Module,
    input_ids: torch.Tensor,
    method: str = "rollout",
    *,
    layers: str | None = None,
    positions: Sequence[int] | None = None,
    steps: int = 32,
    **forward_kwargs: Any,
) -> Mixing:
    """How much each position takes from each token, layer by layer, by one method.

    Args:
        model: a language model (:class:`attnlab.GPT` of any family, or any module whose
            attention layers are :class:`~attnlab.nn.multihead.MultiHeadAttention`).
        input_ids: the tokens.
        method: one of :data:`METHODS` (see the module docstring for each one's equation).
        layers: the attention layers to read, by path prefix (``"encoder."`` for an
            encoder-decoder's source side); default every one. The layers read must attend
            over the same tokens (an encoder-decoder's cross-attention and decoder are not
            rolled out with its encoder).
        positions: the output positions whose rows ``grad_weights`` and
            ``integrated_gradients`` compute (one backward pass, or ``steps`` forwards, per
            position; the other rows are 0); default every one. The other methods compute every
            row at once and ignore it.
        steps: ``integrated_gradients``' interpolation steps (default 32).
        **forward_kwargs: further arguments of ``model(input_ids, ...)`` (``attention_mask``;
            ``tgt_in`` for an :class:`attnlab.Transformer`).

    Returns:
        A :class:`Mixing`.

    Raises:
        ValueError: an unknown method, or one that needs what the model does not have
            (``norm_residual``/``alti`` need blocks exposing their residual stream; ``flow`` a
            short input).
        TypeError: ``input_ids`` not an integer tensor.

    Shape:
        input_ids ``(B, T)``; matrices ``(L, B, T, T)`` (see :class:`Mixing`).

    Examples:
        >>> m = mixing(model, ids, "alti")
        >>> m.total[0, -1]  # what the last position takes from each token
    """
    if method not in METHODS:
        raise ArgumentError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point():
        raise ArgumentTypeError(
            f"input_ids must be an integer tensor (B, T), got "
            f"{getattr(input_ids, 'dtype', type(input_ids).__name__)}"
        )
    check_fits(
        f"input_ids of {input_ids.shape[-1]} tokens",
        mixing_bytes(model, method, *input_ids.shape[-2:]) if input_ids.dim() == 2 else 0,
        what=f"{method}'s matrices (layers × heads × T × T; token vectors T × T × d_model)",
    )
    if method in ("value_zeroing", "grad_weights", "integrated_gradients"):
        from attnlab.inspect import mixing_causal

        return mixing_causal.run(
            model, input_ids, method, layers, forward_kwargs, positions=positions, steps=steps
        )
    runs, _ = record_layers(model, lambda: model(input_ids, **forward_kwargs))
    if method == "alti" and layers is None and any(r.role == "cross_attn" for r in runs):
        return _alti_plus(runs)
    runs = _select(runs, layers)
    names = [r.name for r in runs]
    per_head = None
    total = None
    if method in ("weights", "rollout", "flow"):
        per_head = torch.stack([r.weights for r in runs])  # (L, B, H, T_q, T_k)
        per_layer = per_head.mean(2)
        if method != "weights":
            means = [r.weights.mean(1) for r in runs]
            total = rollout(means) if method == "rollout" else max_flow(means)
            per_head = None
    elif method == "norm":
        heads, layer = [], []
        for r in runs:
            vectors = token_vectors(r.weights, r.call.v, r.w_out)
            layer.append(vectors.norm(dim=-1))
            # ‖α^h_ij f_h(x_j)‖ = α^h_ij ‖f_h(x_j)‖ (a scalar times a vector)
            heads.append(token_vectors_per_head_norm(r))
        per_layer, per_head = torch.stack(layer), torch.stack(heads)
    else:  # norm_residual, alti
        per_layer = torch.stack([_decomposed(r, method) for r in runs])
        if method == "alti":
            total = rollout(list(per_layer), residual=False)
    return Mixing(method, MEANING[method], names, per_layer, per_head, total)


def mixing_bytes(model: nn.Module, method: str, batch: int, t: int) -> int:
    """The memory :func:`mixing` needs at most, from the model's sizes, before it runs.

    Every method keeps each layer's weights (``L · B · H · T²`` numbers; ``grad_weights`` their
    autograd graph too, about three times that); the decompositions one layer's token vectors
    at a time (``B · T² · d_model``); value zeroing a forward of ``B · (T + 1)`` rows.

    Args:
        model: the model.
        method: the method.
        batch: ``B``.
        t: ``T``.

    Returns:
        Bytes (a bound, in the weights' dtype).
    """
    modules = attention_modules(model)
    if not modules:
        return 0
    first = next(iter(modules.values()))
    param = next(iter(model.parameters()), None)
    size = param.element_size() if param is not None else 4
    layers, heads, d = len(modules), first.num_heads, first.d_model
    weights = layers * batch * heads * t * t
    total = weights * (3 if method == "grad_weights" else 1)
    if method in ("norm", "norm_residual", "alti"):
        total += 2 * batch * t * t * d + (weights if method == "norm" else 0)
    if method == "value_zeroing":
        total = batch * (t + 1) * (heads * t * t + 8 * t * d)  # one layer's weights, activations
    return total * size


def _decomposed(r: LayerRun, method: str) -> torch.Tensor:
    """One block's ``‖T_i(x_j)‖`` (``norm_residual``) or ALTI contributions, the residual stream
    and a post-norm block's LayerNorm included; a cross-attention block's residual stream is one
    more column after the ``S`` keys (ALTI+)."""
    if r.resid_pre is None or r.attn_out is None:
        raise ArgumentError(
            f"{method} needs the residual stream around {r.name} (a block with its hook_resid_* "
            f"and hook_*attn_out points, e.g. attnlab.GPT's)"
        )
    if r.call.cross:  # T_i(e_s) for the encoder outputs, then the residual y_i itself
        vectors = token_vectors(r.weights, r.call.v, r.w_out)
        vectors = torch.cat([vectors, r.resid_pre[:, :, None].to(vectors.dtype)], 2)
    else:
        vectors = token_vectors(r.weights, r.call.v, r.w_out, residual=r.resid_pre)
    y = r.resid_pre + r.attn_out  # the residual stream after attention
    if r.post_norm is not None:  # LN(x + a): through the norm, exactly
        vectors, y = through_layer_norm(vectors, r.b_out, r.post_norm)
    if method == "norm_residual":
        return vectors.norm(dim=-1)
    return alti_contributions(vectors, y, own=vectors.shape[2] - 1 if r.call.cross else None)


def _alti_plus(runs: list[LayerRun]) -> Mixing:
    """ALTI+ of an encoder-decoder: each target position's source and target contributions."""
    encoder = [r for r in runs if r.role == "self_attn"]
    decoder_self = [r for r in runs if r.role == "self_attn@decoder"]
    cross = [r for r in runs if r.role == "cross_attn"]
    if not encoder or len(decoder_self) != len(cross):
        raise ArgumentError(
            "ALTI+ reads an encoder's self-attention and each decoder layer's self- and "
            "cross-attention; choose one stack with layers= for anything else"
        )
    r_enc = rollout([_decomposed(r, "alti") for r in encoder], residual=False)
    total = alti_plus(
        r_enc,
        [_decomposed(r, "alti") for r in decoder_self],
        [_decomposed(r, "alti") for r in cross],
    )
    meaning = "ALTI+ contribution (source tokens, then target tokens)"
    return Mixing("alti", meaning, [r.name for r in runs], None, total=total)


def _select(runs: list[LayerRun], layers: str | None) -> list[LayerRun]:
    """The layers under the prefix ``layers``; they must all attend over the same tokens."""
    if layers is not None:
        if not isinstance(layers, str):
            raise ArgumentTypeError(f"layers must be a path prefix (str), got {layers!r}")
        chosen = [r for r in runs if r.name.startswith(layers)]
        if not chosen:
            known = ", ".join(r.name for r in runs[:6])
            raise ArgumentError(
                f"layers={layers!r} selects no attention layer; the model has {known}"
            )
        runs = chosen
    shapes = {tuple(r.weights.shape[-2:]) for r in runs}
    if len(shapes) > 1 or any(r.call.cross for r in runs):
        raise mixed_stacks([r.name for r in runs])
    return runs


def mixed_stacks(names: list[str]) -> ArgumentError:
    """The one-line error for layers that attend over different tokens (cross-attention, or an
    encoder and a decoder), naming the stacks ``layers=`` can choose.

    Args:
        names: the attention layers read.

    Returns:
        The error to raise.
    """
    stacks = sorted({n.split(".")[0] + "." for n in names})
    return ArgumentError(
        "the layers read attend over different tokens (cross-attention, or an encoder and a "
        f"decoder): choose one stack with layers=, e.g. {' or '.join(map(repr, stacks))}"
    )


def token_vectors_per_head_norm(run: LayerRun) -> torch.Tensor:
    """``‖α^h_ij W_O^h v^h_j‖ = α^h_ij · ‖W_O^h v^h_j‖`` for every head (Kobayashi et al. 2020).

    Args:
        run: one recorded layer.

    Returns:
        The per-head norms.

    Shape:
        ``(B, H, T_q, T_k)``.
    """
    weights = run.weights
    heads = weights.shape[1]
    v = run.call.v.repeat_interleave(heads // run.call.v.shape[1], dim=1).to(weights.dtype)
    f_norm = torch.einsum("bhjd,hed->bhje", v, run.w_out.to(weights.dtype)).norm(dim=-1)
    return weights * f_norm[:, :, None, :]
