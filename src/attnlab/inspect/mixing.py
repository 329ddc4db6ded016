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

Every method reads what the layer computed (its resolved call, ``hook_call``: the queries and
keys as scored, the values, the masking) and the layer's own ``W_O``. The per-layer methods take
each block of query rows' weights from the call's queries, keys and normalised mask
(:func:`~attnlab.inspect.stats.call_weights`, the tile rule of the statistics), so the model runs
on its fast kernels and only one block of ``T_q × T_k`` exists at a time; ``rows=`` computes
some rows only (the last position's, for a long input), and :func:`mixing_bytes` states each
method's memory (:mod:`attnlab.inspect.mixing_memory`). A window or a BigBird layout gives zero
weight to the keys it hides, so every method sees the layout. A Linformer layer is read through
its effective weights ``A · F`` over the tokens, a Performer layer through its implied
``D⁻¹ φ(Q) φ(K)ᵀ`` (what each method means there: :func:`mixing`). The decompositions
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
from attnlab.inspect.capture import ProjectedKeys, attention_modules
from attnlab.inspect.mixing_memory import (
    FORMULA,
    block_rows,
    method_kind,
    mixing_bytes,
    mixing_memory,
    row_positions,
)
from attnlab.inspect.mixing_rules import (
    alti_contributions,
    alti_plus,
    head_outputs,
    max_flow,
    rollout,
    rollout_rows,
    split_by_token,
    through_layer_norm,
    with_residual,
)
from attnlab.inspect.qk_circuits import head_weights
from attnlab.inspect.stats import call_weights
from attnlab.nn.backends.common import compute_dtype
from attnlab.nn.resolved_call import ResolvedCall

__all__ = [
    "METHODS",
    "LayerRun",
    "Mixing",
    "block_rows",
    "mixing",
    "mixing_bytes",
    "mixing_memory",
    "record_layers",
    "row_positions",
    "value_norms",
]

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
    def tokens(self) -> int:
        """``T_k`` in key *tokens* (a Linformer layer's, not its ``k`` projected rows)."""
        e = self.call.key_projection
        return int(e.shape[-1]) if e is not None else int(self.call.k.shape[-2])

    @property
    def values(self) -> torch.Tensor:
        """The values :attr:`weights` multiply, one per key token: the call's ``v``, a
        Linformer call's values before the sequence projection, ``(B, H_kv, T_k, d_v)``."""
        tokens = self.call.token_values
        return tokens if tokens is not None else self.call.v

    def rows_weights(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The weights over key tokens of some query rows: ``z = weights · values`` exactly.

        The weights the layer returned when they were recorded, else computed from the call's
        queries, keys and normalised mask (:func:`~attnlab.inspect.stats.call_weights`); a
        Linformer layer's effective weights ``A · F``
        (:meth:`~attnlab.inspect.capture.ProjectedKeys.effective_weights`), a FAVOR+ layer's
        implied ``D⁻¹ φ(q) φ(k)ᵀ``.

        Args:
            rows: query indices; default every row.

        Returns:
            The weights of every query head.

        Shape:
            rows ``(R,)`` → ``(B, H, R, T_k)``.
        """
        call = self.call
        if call.weights is not None:
            w = call.weights if rows is None else call.weights[..., rows.to(call.q.device), :]
        else:
            rows = torch.arange(call.q.shape[-2]) if rows is None else rows
            w = call_weights(call, rows.to(call.q.device), compute_dtype(call.q.dtype))
        if call.method == "linformer":
            w = ProjectedKeys.of(call).effective_weights(w)  # A · F: (A F) V = A (F V)
        return w

    @property
    def weights(self) -> torch.Tensor:
        """:meth:`rows_weights` of every row, ``(B, H, T_q, T_k)``."""
        return self.rows_weights()


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
        cumulative: the methods that roll out layer by layer (``rollout``, ``alti``,
            ``grad_weights``): what each layer's outputs take from the input tokens, through
            that layer and those before it; ``cumulative[-1]`` is ``total``. ``None`` for the
            others, for ALTI+ of an encoder-decoder, and with ``rows=`` (the rows of a rollout
            are multiplied from the last layer backwards, and only the last product is kept).
        rows: the query positions of the rows (``rows=`` of :func:`mixing`, increasing), or
            ``None`` when every position has its row.

    Shape:
        per_layer ``(L, B, R, T_k)``; per_head ``(L, B, H, R, T_k)``; total ``(B, R, T)``;
        cumulative ``(L, B, T, T)``; rows ``(R,)`` (``R = T`` without ``rows=``).
    """

    method: str
    meaning: str
    layers: list[str]
    per_layer: torch.Tensor | None
    per_head: torch.Tensor | None = None
    total: torch.Tensor | None = None
    cumulative: torch.Tensor | None = None
    rows: torch.Tensor | None = None


def record_layers(
    model: nn.Module,
    forward: Callable[[], Any],
    *,
    grad: bool = False,
    weights: bool = True,
    stop: bool = False,
) -> tuple[list[LayerRun], Any]:
    """Run ``forward()`` once and record every attention layer's resolved call (with its
    weights), the residual stream entering its block and what it added.

    Args:
        model: any module with :class:`~attnlab.nn.multihead.MultiHeadAttention` layers.
        forward: runs ``model`` once.
        grad: keep the autograd graph (for the gradient methods); else under ``no_grad``.
        weights: make the layers return their weights (``L · B · H · T²`` numbers kept);
            ``False`` leaves them on their fast kernels, and :meth:`LayerRun.rows_weights`
            computes rows from the call when asked.
        stop: stop the forward once every attention layer has run and written its output
            (what follows the last one — an MLP, the final norm, a ``T × V`` of logits — is
            never computed); the output returned is then ``None``.

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
    last: dict[str, str] = {}  # the last hook each layer fires: its output, else its call
    done: set[str] = set()

    def keep(name: str, key: str) -> Callable[..., None]:
        def hook(_mod: nn.Module, _args: Any, out: Any) -> None:
            if key == "call" and name not in order:
                order.append(name)
            seen.setdefault(name, {}).setdefault(key, out)  # the first call of each layer
            if stop and key == last[name]:
                done.add(name)
                if len(done) == len(modules):
                    raise _Done

        return hook

    try:
        for name, attn in modules.items():
            if weights:
                handles.append(attn.hook_weights.register_forward_hook(lambda *_: None))
            handles.append(attn.hook_call.register_forward_hook(keep(name, "call")))
            last[name] = "call"
            block, role = _block_of(parents, name)
            for key, point in zip(("resid_pre", "attn_out"), _STREAM[role][:2]):
                hp = getattr(block, point, None)
                if isinstance(hp, nn.Module):
                    handles.append(hp.register_forward_hook(keep(name, key)))
                    last[name] = key
        out = None
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            try:
                out = forward()
            except _Done:
                pass
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


class _Done(Exception):
    """Raised by :func:`record_layers` (``stop=True``) once every attention layer has run;
    never leaves this module."""


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
    rows: int | slice | Sequence[int] | torch.Tensor | None = None,
    heads: bool = False,
    block_size: int | None = None,
    baseline_id: int = 0,
    steps: int = 32,
    **forward_kwargs: Any,
) -> Mixing:
    """How much each position takes from each token, layer by layer, by one method.

    The per-layer methods (``weights``, ``rollout``, ``flow``, ``norm``, ``norm_residual``,
    ``alti``) run the model once on its fast kernels, keep each layer's resolved call and
    residual stream (``O(T)`` per layer), and go through the query rows block by block:
    only one block's weights (``B · H · block · T``) and token vectors (``B · block · T ·
    d_model``) exist at a time. ``rows=`` computes some rows only — the last position's
    (``rows=-1``) is what a long input usually needs — so the result is ``L · B · R · T``
    numbers instead of ``L · B · T²``; a rollout (``rollout``, ``alti``'s total) of some rows
    multiplies from the last layer backwards and still reads every row of every earlier layer,
    one block at a time (the time of the whole matrix, not its memory). ``flow`` (at most
    :data:`~attnlab.inspect.mixing_rules.MAX_FLOW_LENGTH` tokens) and the methods that run the
    model again (``value_zeroing``, ``grad_weights``, ``integrated_gradients``) are not
    streamed; ``rows=`` cuts their result (and the gradient methods' backward passes) to the
    rows asked for. :func:`mixing_bytes` states each method's memory; a length that does not fit
    is refused in one line before anything runs.

    **Linformer** (Wang et al. 2020) attends over ``k`` rows of ``E K``, each a mix of every
    token; its output is exactly ``(A F) V``, so every method reads its *effective weights*
    ``A · F`` (:class:`~attnlab.inspect.capture.ProjectedKeys`) and its values ``V`` before the
    projection: ``weights`` is what query ``i`` takes from token ``t`` through the value path
    (signed: ``F`` has entries of both signs, and rows need not sum to 1); ``norm``,
    ``norm_residual`` and ``alti`` split the layer's output by token through ``F`` exactly
    (``Σ_t T_i(x_t) + b_O`` is the output); ``rollout`` multiplies ``0.5 · A F + 0.5 · I``
    through the layers without renormalising its rows (the signed linear map of the value path
    and the residual, not a share); ``value_zeroing`` zeroes token ``t``'s value before the
    projection. ``flow`` is refused: a maximum flow needs non-negative capacities.
    **Performer** (FAVOR+) has no weight matrix, but its output is exactly ``P V`` with the
    implied ``P = D⁻¹ φ(Q) φ(K)ᵀ`` (non-negative, rows summing to 1), which every method reads
    as the weights of softmax attention.

    Args:
        model: a language model (:class:`attnlab.GPT` of any family, or any module whose
            attention layers are :class:`~attnlab.nn.multihead.MultiHeadAttention`).
        input_ids: the tokens.
        method: one of :data:`METHODS` (see the module docstring for each one's equation).
        layers: the attention layers to read, by path prefix (``"encoder."`` for an
            encoder-decoder's source side); default every one. The layers read must attend
            over the same tokens (an encoder-decoder's cross-attention and decoder are not
            rolled out with its encoder).
        rows: the query positions to compute: an int (``-1``: the last), a slice, or indices
            (distinct; returned in increasing order); default every position.
        heads: also return each head's matrix for ``weights`` and ``norm`` (``H`` times the
            memory of the result); default the head mean (or sum) only.
        block_size: query rows per block; default as many as keep a block's token vectors
            near :data:`~attnlab.inspect.stats.TILE_ELEMENTS` numbers. The result does not
            depend on it beyond rounding.
        baseline_id: ``integrated_gradients`` only: the token whose embedding, at every
            position, is the path's start (not the zero vector, which a model whose first
            operation is a norm cannot be integrated from; :mod:`attnlab.inspect.mixing_causal`).
        steps: ``integrated_gradients`` only: its interpolation steps (default 32).
        **forward_kwargs: further arguments of ``model(input_ids, ...)`` (``attention_mask``;
            ``tgt_in`` for an :class:`attnlab.Transformer`).

    Returns:
        A :class:`Mixing`, in the compute dtype of the model (fp32 for half precision).

    Raises:
        ValueError: an unknown method, one that needs what the model does not have
            (``norm_residual``/``alti`` need blocks exposing their residual stream; ``flow`` a
            short input and no Linformer layer), bad ``rows``, or an input whose memory
            (:func:`mixing_bytes`) exceeds the machine's.
        TypeError: ``input_ids`` not an integer tensor.

    Shape:
        input_ids ``(B, T)``; matrices ``(L, B, R, T)`` (see :class:`Mixing`).

    Examples:
        >>> m = mixing(model, ids, "alti")
        >>> m.total[0, -1]  # what the last position takes from each token
        >>> mixing(model, long_ids, "norm", rows=-1).per_layer[:, 0, 0]  # (L, T): the last row
    """
    if method not in METHODS:
        raise ArgumentError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point():
        raise ArgumentTypeError(
            f"input_ids must be an integer tensor (B, T), got "
            f"{getattr(input_ids, 'dtype', type(input_ids).__name__)}"
        )
    if block_size is not None and (not isinstance(block_size, int) or block_size < 1):
        raise ArgumentError(f"block_size must be a positive int or None, got {block_size!r}")
    if isinstance(baseline_id, bool) or not isinstance(baseline_id, int) or baseline_id < 0:
        raise ArgumentTypeError(f"baseline_id must be a token id (int >= 0), got {baseline_id!r}")
    if input_ids.dim() == 2:
        b, t = input_ids.shape
        n_rows = None if rows is None else _count(rows, t)
        need = mixing_bytes(model, method, b, t, rows=n_rows, heads=heads)
        check_fits(
            f"input_ids of {t} tokens (T = {t})",
            need,
            what=f"{method} ({FORMULA[method_kind(method)]}; rows= computes fewer query rows)",
        )
    linear = ("norm", "norm_residual", "alti")  # a head's output decomposed through W_O
    if method in linear and any(
        getattr(m, "ln_attn_out", None) is not None for m in model.modules()
    ):
        raise ArgumentError(
            f"method {method!r} decomposes each head's output through W_O, but the model "
            "normalises what attention adds (a sandwich norm, ln_attn_out: Gemma 2); use one of "
            f"{', '.join(m for m in METHODS if m not in linear)}"
        )
    if method in ("value_zeroing", "grad_weights", "integrated_gradients"):
        from attnlab.inspect import mixing_causal

        return mixing_causal.run(
            model,
            input_ids,
            method,
            layers,
            forward_kwargs,
            rows,
            baseline_id=baseline_id,
            steps=steps,
        )
    forward = lambda: model(input_ids, **forward_kwargs)  # noqa: E731
    runs, _ = record_layers(model, forward, weights=False, stop=True)
    if method == "alti" and layers is None and any(r.role == "cross_attn" for r in runs):
        return _alti_plus(runs, rows, block_size)
    runs = _select(runs, layers)
    return _streamed(runs, method, rows, heads, block_size)


def _count(rows: int | slice | Sequence[int] | torch.Tensor, t: int) -> int:
    """How many rows ``rows=`` asks for, before they are checked against the layers' ``T_q``
    (an encoder-decoder's target may be longer than ``input_ids``)."""
    if isinstance(rows, slice):
        return len(range(t)[rows])
    if isinstance(rows, int):
        return 1
    if isinstance(rows, (torch.Tensor, Sequence)):
        return len(rows)
    return len(row_positions(rows, t))  # refuses the type


class _Rows:
    """One layer's matrix of one method, row block by row block (the heads' outputs ``f``
    computed once)."""

    def __init__(self, run: LayerRun, method: str, heads: bool) -> None:
        self.run, self.method, self.heads = run, method, heads
        self._f: torch.Tensor | None = None

    def f(self, dtype: torch.dtype) -> torch.Tensor:
        if self._f is None:
            self._f = head_outputs(self.run.values, self.run.w_out, self.run.call.num_heads, dtype)
        return self._f

    def __call__(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The rows' matrix ``(B, R, T_k)`` and, with ``heads``, each head's ``(B, H, R, T_k)``."""
        w = self.run.rows_weights(rows)
        if self.method in ("weights", "rollout", "flow"):
            return w.mean(1), w if self.heads else None
        f = self.f(w.dtype)
        if self.method == "norm":
            # ‖Σ_h α^h_ij f_h(x_j)‖; per head ‖α^h_ij f_h(x_j)‖ = |α^h_ij| ‖f_h(x_j)‖
            per_head = w.abs() * f.norm(dim=-1)[:, :, None, :] if self.heads else None
            return split_by_token(w, f).norm(dim=-1), per_head
        return _decomposed(self.run, self.method, w, f, rows), None


@torch.no_grad()  # a post-norm block's LayerNorm parameters would keep a graph
def _streamed(
    runs: list[LayerRun],
    method: str,
    rows: int | slice | Sequence[int] | torch.Tensor | None,
    heads: bool,
    block_size: int | None,
) -> Mixing:
    """The per-layer methods, block of query rows by block (:func:`mixing`)."""
    call = runs[0].call
    b, h, t = call.q.shape[0], call.num_heads, call.q.shape[-2]
    idx = row_positions(rows, t)
    signed = any(r.call.method == "linformer" for r in runs)
    if method == "flow" and signed:
        raise ArgumentError(
            "flow needs non-negative capacities, but a Linformer layer's effective weights "
            "A·F are signed: use rollout (its signed product) or alti"
        )
    vectors = method not in ("weights", "rollout", "flow")  # token vectors per row, or weights
    block = block_size or block_rows(b, t, h, runs[0].w_out.shape[1] if vectors else 0)
    want = torch.arange(t) if method == "flow" else idx
    layer_rows = [_Rows(r, method, heads) for r in runs]
    per_layer, per_head = [], []
    for rows_of in layer_rows:
        parts = [rows_of(want[i0 : i0 + block]) for i0 in range(0, len(want), block)]
        per_layer.append(torch.cat([p[0] for p in parts], 1))
        if heads and method in ("weights", "norm"):
            per_head.append(torch.cat([p[1] for p in parts if p[1] is not None], 2))
        rows_of._f = None  # one layer's heads' outputs at a time
    matrices = torch.stack(per_layer)
    total = cumulative = None
    if method == "flow":
        total = max_flow(list(matrices))[:, idx]
        matrices = matrices[:, :, idx]
    elif method in ("rollout", "alti"):

        def step(m: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            if method == "alti":  # ALTI's contributions count the residual already
                return m
            return with_residual(m, positions, renormalise=not signed)

        def earlier(layer: int, positions: torch.Tensor) -> torch.Tensor:
            return step(layer_rows[layer](positions)[0], positions)

        if len(idx) == t:  # every row: forwards through the layers, each prefix kept
            steps = [step(m, idx) for m in matrices]
            cumulative = rollout(steps, residual=False, cumulative=True)
            total = cumulative[-1]
        else:  # some rows: from the last layer backwards, each earlier layer by blocks
            total = rollout_rows(step(matrices[-1], idx), earlier, len(runs), t, block)
    return Mixing(
        method,
        MEANING[method],
        [r.name for r in runs],
        matrices,
        torch.stack(per_head) if per_head else None,
        total,
        cumulative,
        None if rows is None else idx,
    )


def _decomposed(
    r: LayerRun, method: str, w: torch.Tensor, f: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """Some rows of one block's ``‖T_i(x_j)‖`` (``norm_residual``) or ALTI contributions, the
    residual stream and a post-norm block's LayerNorm included; a cross-attention block's
    residual stream is one more column after the ``S`` keys (ALTI+)."""
    if r.resid_pre is None or r.attn_out is None:
        raise ArgumentError(
            f"{method} needs the residual stream around {r.name} (a block with its hook_resid_* "
            f"and hook_*attn_out points, e.g. attnlab.GPT's)"
        )
    rows = rows.to(r.resid_pre.device)
    resid = r.resid_pre[:, rows]
    own: int | torch.Tensor
    if r.call.cross:  # T_i(e_s) for the encoder outputs, then the residual y_i itself
        vectors = split_by_token(w, f)
        vectors = torch.cat([vectors, resid[:, :, None].to(vectors.dtype)], 2)
        own = vectors.shape[2] - 1
    else:
        own = rows + (r.tokens - r.call.q.shape[-2])  # query i at position p_i
        vectors = split_by_token(w, f, residual=resid, positions=own)
    y = resid + r.attn_out[:, rows]  # the residual stream after attention
    if r.post_norm is not None:  # LN(x + a): through the norm, exactly
        vectors, y = through_layer_norm(vectors, r.b_out, r.post_norm)
    if method == "norm_residual":
        return vectors.norm(dim=-1)
    return alti_contributions(vectors, y, own=own)


@torch.no_grad()
def _alti_plus(
    runs: list[LayerRun],
    rows: int | slice | Sequence[int] | torch.Tensor | None,
    block_size: int | None,
) -> Mixing:
    """ALTI+ of an encoder-decoder: each target position's source and target contributions
    (every row of every layer, block by block; ``rows`` cuts the result)."""
    encoder = [r for r in runs if r.role == "self_attn"]
    decoder_self = [r for r in runs if r.role == "self_attn@decoder"]
    cross = [r for r in runs if r.role == "cross_attn"]
    if not encoder or len(decoder_self) != len(cross):
        raise ArgumentError(
            "ALTI+ reads an encoder's self-attention and each decoder layer's self- and "
            "cross-attention; choose one stack with layers= for anything else"
        )

    def full(r: LayerRun) -> torch.Tensor:
        t = r.call.q.shape[-2]
        b, h, d = r.call.q.shape[0], r.call.num_heads, r.w_out.shape[1]
        block = block_size or block_rows(b, r.tokens, h, d)
        rows_of = _Rows(r, "alti", False)
        parts = [rows_of(torch.arange(i0, min(t, i0 + block)))[0] for i0 in range(0, t, block)]
        return torch.cat(parts, 1)

    r_enc = rollout([full(r) for r in encoder], residual=False)
    total = alti_plus(r_enc, [full(r) for r in decoder_self], [full(r) for r in cross])
    idx = None if rows is None else row_positions(rows, total.shape[1])
    meaning = "ALTI+ contribution (source tokens, then target tokens)"
    names = [r.name for r in runs]
    return Mixing(
        "alti", meaning, names, None, total=total if idx is None else total[:, idx], rows=idx
    )


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
    shapes = {(r.call.q.shape[-2], r.tokens) for r in runs}
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


def value_norms(run: LayerRun) -> torch.Tensor:
    """``‖f_h(x_j)‖ = ‖W_O^h v^h_j‖``, the size of what each head would move from each token if
    it put all its weight there (Kobayashi et al. 2020, §4: a sink token's is small), from the
    values the layer computed (a grouped key/value head's shared by its query heads; a
    Linformer layer's values before the projection, :attr:`LayerRun.values`).

    Args:
        run: one recorded layer (:func:`record_layers`).

    Returns:
        The norms, per query head and key.

    Shape:
        ``(B, H, T_k)``.
    """
    return head_outputs(run.values, run.w_out, run.w_out.shape[0], run.w_out.dtype).norm(dim=-1)
