"""The equations of context mixing, on what a layer computed (no model runs here).

Each function takes the quantities one attention layer used — its weights, its values, its
output projection, the residual stream it wrote into — and returns a ``T_q × T_k`` matrix of how
much each output position takes from each input token (:func:`attnlab.inspect.mixing`):

- :func:`rollout` (Abnar & Zuidema 2020): ``Ã_l = 0.5 · A_l + 0.5 · I`` (rows renormalised),
  multiplied through the layers, ``R = Ã_L ⋯ Ã_1``;
- :func:`max_flow` (Abnar & Zuidema 2020): the maximum flow from input token ``j`` to output
  position ``i`` through the layered graph whose edges carry ``Ã_l``;
- :func:`token_vectors`: a layer's attention output split by the token it comes from,
  ``T_i(x_j) = Σ_h α^h_ij W_O^h v^h_j (+ x_i when j = i: the residual)`` — exact: the vectors
  sum to the layer's output minus the output bias (Kobayashi et al. 2020, 2021);
- :func:`alti_contributions` (Ferrando et al. 2022): ``c_ij ∝ max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)``,
  rows summing to 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attnlab.errors import ArgumentError

__all__ = [
    "MAX_FLOW_LENGTH",
    "alti_contributions",
    "alti_plus",
    "head_outputs",
    "max_flow",
    "rollout",
    "rollout_rows",
    "split_by_token",
    "through_layer_norm",
    "token_vectors",
    "with_residual",
]

#: the longest sequence :func:`max_flow` accepts: it solves ``T²`` maximum-flow problems over a
#: graph of ``L · T²`` edges (networkx's Boykov–Kolmogorov on one residual network), about 7 s at
#: 32 tokens and 6 layers on one CPU core of a shared machine (a random causal input)
MAX_FLOW_LENGTH = 32


def with_residual(
    weights: torch.Tensor, positions: torch.Tensor | None = None, *, renormalise: bool = True
) -> torch.Tensor:
    """``Ã = 0.5 · A + 0.5 · I``, rows renormalised (Abnar & Zuidema 2020, §3): the residual
    connection counted as attention to the token itself.

    Args:
        weights: one layer's weights, averaged over heads (all rows, or some rows).
        positions: the token of each row (its column of ``I``); default row ``i`` is token
            ``i``.
        renormalise: divide each row by its sum (default). ``False`` for signed effective
            weights (Linformer's ``A · F``), whose rows do not sum to 1: ``Ã`` is then the linear
            map the value path and the residual compose to.

    Returns:
        ``Ã``; with ``renormalise`` each row sums to 1 (a row of zeros — a query that sees no
        key — keeps only itself).

    Shape:
        ``(B, R, T)`` → ``(B, R, T)``; positions ``(R,)``.
    """
    r = weights.shape[-2]
    rows = torch.arange(r, device=weights.device)
    columns = rows if positions is None else positions.to(weights.device)
    mixed = 0.5 * weights
    mixed[..., rows, columns] += 0.5
    return mixed / mixed.sum(-1, keepdim=True) if renormalise else mixed


def rollout(
    matrices: Sequence[torch.Tensor], *, residual: bool = True, cumulative: bool = False
) -> torch.Tensor:
    """Attention rollout: ``R = Ã_L ⋯ Ã_2 Ã_1`` (Abnar & Zuidema 2020, eq. 1).

    ``R[i, j]`` is how much of output position ``i`` (after the last layer) comes from input
    token ``j``, if each layer mixed its inputs linearly by ``Ã``. With ``cumulative`` every
    prefix ``R_l = Ã_l ⋯ Ã_1`` (what layer ``l``'s outputs take from the tokens), the last of
    which is ``R``, the same tensor.

    Args:
        matrices: each layer's mixing matrix, first layer first (head-averaged weights for
            rollout proper; ALTI's contributions with ``residual=False``).
        residual: add the identity first (:func:`with_residual`); ``False`` when the matrices
            already count the residual stream (ALTI, Chefer et al.'s relevance).
        cumulative: return every layer's ``R_l``, not only the last.

    Returns:
        ``R``, or with ``cumulative`` ``R_1, …, R_L`` stacked.

    Raises:
        ValueError: no layer, or a layer that is not square (cross-attention, Linformer's
            projected rows).

    Shape:
        each ``(B, T, T)`` → ``(B, T, T)``; with ``cumulative`` ``(L, B, T, T)``.
    """
    if not matrices:
        raise ArgumentError("rollout needs at least one layer, got none")
    for a in matrices:
        if a.shape[-1] != a.shape[-2]:
            raise ArgumentError(
                f"rollout multiplies square T × T layers, got a {a.shape[-2]} × {a.shape[-1]} one"
            )
    steps = [with_residual(a) if residual else a for a in matrices]
    result = steps[0]
    prefixes = [result]
    for step in steps[1:]:
        # R_l = Ã_l R_{l−1}: output i of layer l takes Ã_l[i, k] of position k, which took
        # R_{l−1}[k, j] of token j
        result = step @ result
        prefixes.append(result)
    return torch.stack(prefixes) if cumulative else result


def rollout_rows(
    last: torch.Tensor,
    earlier: Callable[[int, torch.Tensor], torch.Tensor],
    layers: int,
    t: int,
    block: int,
) -> torch.Tensor:
    """Some rows of a rollout, ``R[rows] = M_L[rows] M_{L−1} ⋯ M_1``, multiplied from the last
    layer backwards so that each earlier layer's ``M_l`` is only ever held one block of rows
    at a time: ``r ← Σ_blocks r[:, block] M_l[block, :]``. Memory ``O(R · T + block · T)``; the
    time is that of every layer's whole matrix (a rollout needs all of them).

    Args:
        last: ``M_L`` at the rows asked for (each step's residual already added).
        earlier: ``earlier(l, positions)`` gives ``M_l`` at those rows (``l`` from 0, the first
            layer; the residual added as in ``last``).
        layers: ``L``.
        t: ``T``, the tokens (rows of every ``M_l``).
        block: rows per block.

    Returns:
        ``R[rows]``: with all rows, :func:`rollout`'s ``R`` up to rounding.

    Shape:
        last ``(B, R, T)`` → ``(B, R, T)``.
    """
    r = last
    for layer in reversed(range(layers - 1)):
        acc = torch.zeros_like(r)
        for i0 in range(0, t, block):
            positions = torch.arange(i0, min(t, i0 + block), device=r.device)
            # (R_{>l} M_l)[rows] = Σ_k R_{>l}[rows, k] M_l[k, :], k over the block
            acc += r[..., i0 : i0 + len(positions)] @ earlier(layer, positions).to(r.dtype)
        r = acc
    return r


def max_flow(matrices: Sequence[torch.Tensor]) -> torch.Tensor:
    """Attention flow: the maximum flow from each input token to each output position through
    the layers, each edge ``(l − 1, j) → (l, i)`` of capacity ``Ã_l[i, j]``
    (Abnar & Zuidema 2020, §3), solved by networkx.

    Args:
        matrices: each layer's head-averaged weights ``A_l`` (the residual is added here, as in
            :func:`rollout`), first layer first.

    Returns:
        ``F[b, i, j]``, the flow value from token ``j`` to position ``i``.

    Raises:
        ValueError: longer than :data:`MAX_FLOW_LENGTH` tokens (the cost grows as ``T⁴ · L``).

    Shape:
        each ``(B, T, T)`` → ``(B, T, T)``.
    """
    import networkx as nx
    from networkx.algorithms.flow import boykov_kolmogorov, build_residual_network

    t = matrices[0].shape[-1]
    if t > MAX_FLOW_LENGTH:
        raise ArgumentError(
            f"flow solves T² maximum-flow problems over L·T² edges: at most {MAX_FLOW_LENGTH} "
            f"tokens, got {t} (use rollout for longer inputs)"
        )
    layers = [with_residual(a).detach().double().cpu() for a in matrices]
    n_layers, b = len(layers), layers[0].shape[0]
    out = torch.zeros(b, t, t, dtype=torch.float64)
    for row in range(b):
        graph = nx.DiGraph()
        for layer, a in enumerate(layers, start=1):
            for i in range(t):
                for j in range(t):
                    cap = float(a[row, i, j])
                    if cap > 0.0:
                        graph.add_edge((layer - 1, j), (layer, i), capacity=cap)
        # one residual network for all T² problems (each solve resets its flows), and no solve
        # where no path joins j to i (a causal model's j > i): 4–12× faster than a fresh
        # network per problem, the same values
        residual = build_residual_network(graph, "capacity")
        for j in range(t):
            source = (0, j)
            reached = nx.descendants(graph, source) if source in graph else set()
            for i in range(t):
                if (n_layers, i) in reached:
                    solved = boykov_kolmogorov(
                        graph, source, (n_layers, i), residual=residual, value_only=True
                    )
                    out[row, i, j] = solved.graph["flow_value"]
    return out.to(matrices[0].dtype)


def token_vectors(
    weights: torch.Tensor,
    values: torch.Tensor,
    w_out: torch.Tensor,
    residual: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """One attention layer's output split by source token (Kobayashi et al. 2020, eq. 5;
    with ``residual``, 2021's ATTN-RES):

        T_i(x_j) = Σ_h α^h_ij · W_O^h v^h_j   (+ x_i when j = i)

    With the output bias ``b_O``, ``Σ_j T_i(x_j) + b_O`` is the layer's output (plus ``x_i``): the
    decomposition is exact, since ``z^h_i = Σ_j α^h_ij v^h_j`` and ``W_O`` is linear.

    Args:
        weights: the weights of every query head, as the layer computed them.
        values: the values they multiply (``H_kv`` heads; the output bias of ``W_V`` included,
            as the layer added it).
        w_out: ``W_O`` per head (:func:`attnlab.inspect.head_weights`' ``output``).
        residual: the residual stream ``x`` the layer adds its output to, or ``None``.
        positions: with some query rows only (``weights`` cut to them): the token of each row;
            ``residual`` is then the stream at those rows. Default every row, row ``i`` at
            position ``i + T_k − T_q``.

    Returns:
        ``T[b, i, j, :]``.

    Shape:
        weights ``(B, H, T_q, T_k)``; values ``(B, H_kv, T_k, d_head)``; w_out
        ``(H, d_model, d_head)``; residual ``(B, T_q, d_model)`` (``T_q == T_k``) →
        ``(B, T_q, T_k, d_model)``.
    """
    return split_by_token(
        weights, head_outputs(values, w_out, weights.shape[1], weights.dtype), residual, positions
    )


def head_outputs(
    values: torch.Tensor, w_out: torch.Tensor, heads: int, dtype: torch.dtype
) -> torch.Tensor:
    """``f_h(x_j) = W_O^h v^h_j``: what each head writes for each token at weight 1.

    Args:
        values: the values (``H_kv`` heads).
        w_out: ``W_O`` per head.
        heads: ``H`` (grouped values repeated to the query heads).
        dtype: computed in this dtype.

    Returns:
        ``f``.

    Shape:
        values ``(B, H_kv, T_k, d_head)``; w_out ``(H, d_model, d_head)`` →
        ``(B, H, T_k, d_model)``.
    """
    v = values.repeat_interleave(heads // values.shape[1], dim=1).to(dtype)
    # f_h(x_j) = W_O^h v^h_j                                            (B, H, T_k, d_model)
    return torch.einsum("bhjd,hed->bhje", v, w_out.to(dtype))


def split_by_token(
    weights: torch.Tensor,
    f: torch.Tensor,
    residual: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`token_vectors` from the heads' outputs ``f`` (:func:`head_outputs`), computed once
    per layer when the rows come block by block.

    Args:
        weights: the weights of every query head (all rows, or some rows).
        f: :func:`head_outputs`.
        residual: as :func:`token_vectors`.
        positions: as :func:`token_vectors`.

    Returns:
        ``T[b, i, j, :]``.

    Shape:
        weights ``(B, H, T_q, T_k)``; f ``(B, H, T_k, d_model)`` → ``(B, T_q, T_k, d_model)``.
    """
    # Σ_h α^h_ij f_h(x_j)                                               (B, T_q, T_k, d_model)
    vectors = torch.einsum("bhij,bhje->bije", weights, f.to(weights.dtype))
    if residual is not None:
        if positions is None and residual.shape[1] != vectors.shape[2]:
            raise ArgumentError(
                f"the residual stream has {residual.shape[1]} positions but the layer "
                f"attends over {vectors.shape[2]} keys: the residual needs self-attention"
            )
        t_q, t_k = vectors.shape[1], vectors.shape[2]
        if positions is None:
            positions = torch.arange(t_q, device=vectors.device) + (t_k - t_q)  # query i at p_i
            residual = residual[:, -t_q:]
        vectors[:, torch.arange(t_q), positions.to(vectors.device)] += residual.to(vectors.dtype)
    return vectors


def through_layer_norm(
    vectors: torch.Tensor, bias: torch.Tensor, norm: torch.nn.LayerNorm
) -> tuple[torch.Tensor, torch.Tensor]:
    """A post-norm block's token vectors through its LayerNorm (Kobayashi et al. 2021, §3;
    Ferrando et al. 2022, eq. 6): with ``s_i = Σ_j z_ij + b`` and ``σ_i`` its standard deviation
    as the layer computed it,

        LN(s_i) = Σ_j γ ⊙ (z_ij − mean(z_ij)) / σ_i  +  γ ⊙ (b − mean(b)) / σ_i + β

    exactly: the mean is linear, and ``σ_i`` is one number per position.

    Args:
        vectors: ``z_ij``, the residual included (:func:`token_vectors`).
        bias: ``b``, what no token brings (the output projection's bias).
        norm: the block's LayerNorm after the residual connection.

    Returns:
        ``(T_i(x_j), LN(s_i))``: the vectors after the norm and the block's output.

    Shape:
        vectors ``(B, T_q, T_k, d_model)``; bias ``(d_model,)`` → ``(B, T_q, T_k, d_model)``,
        ``(B, T_q, d_model)``.
    """
    s = vectors.sum(2) + bias  # the sum the LayerNorm saw                (B, T_q, d_model)
    sigma = (s.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # (B, T_q, 1)
    gamma = (norm.weight if norm.weight is not None else torch.ones_like(bias)).to(vectors.dtype)
    centred = vectors - vectors.mean(-1, keepdim=True)
    out = gamma * centred / sigma[:, :, None, :]
    beta = norm.bias.to(vectors.dtype) if norm.bias is not None else 0.0
    y = out.sum(2) + gamma * (bias - bias.mean()) / sigma + beta
    return out, y


def alti_contributions(
    vectors: torch.Tensor, output: torch.Tensor, *, own: int | torch.Tensor | None = None
) -> torch.Tensor:
    """ALTI's contributions of one layer (Ferrando et al. 2022, eq. 8–9): the closer the part a
    token gives to the output, in Manhattan distance, the more it contributes,

        c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁) / Σ_k max(0, ‖y_i‖₁ − ‖y_i − T_i(x_k)‖₁)

    Args:
        vectors: the token vectors ``T_i(x_j)`` (:func:`token_vectors`, residual included).
        output: the layer's output ``y_i`` (their sum, and the bias).
        own: the column a row gives everything to when no part is closer than zero: default
            the row's own position (self-attention); a cross-attention block's residual column;
            one column per row (a tensor) for some rows of a self-attention.

    Returns:
        ``c``; each row sums to 1.

    Shape:
        vectors ``(B, T_q, T_k, d_model)``; output ``(B, T_q, d_model)`` → ``(B, T_q, T_k)``.
    """
    y = output.to(vectors.dtype)
    distance = (y[:, :, None, :] - vectors).abs().sum(-1)  # ‖y_i − T_i(x_j)‖₁   (B, T_q, T_k)
    closeness = (y.abs().sum(-1, keepdim=True) - distance).clamp(min=0.0)
    total = closeness.sum(-1, keepdim=True)
    t_q, t_k = closeness.shape[-2:]
    fallback = torch.zeros_like(closeness)
    if isinstance(own, torch.Tensor):
        columns = own.to(closeness.device)
    else:
        columns = torch.arange(t_q) + (t_k - t_q) if own is None else torch.full((t_q,), own)
    fallback[:, torch.arange(t_q), columns] = 1.0
    return torch.where(total > 0, closeness / total.clamp(min=torch.finfo(y.dtype).tiny), fallback)


def alti_plus(
    encoder: torch.Tensor,
    self_blocks: Sequence[torch.Tensor],
    cross_blocks: Sequence[torch.Tensor],
) -> torch.Tensor:
    """ALTI+ (Ferrando et al. 2022b, §3): what each target position of an encoder-decoder takes
    from the source tokens and from the target tokens before it, through every decoder layer.

    With ``R_enc`` the encoder's rolled-out ALTI (source tokens → encoder outputs), a decoder
    layer's self-attention contributions ``C^self`` (target → target) and its cross-attention
    contributions ``C^cross`` over the ``S`` encoder outputs and, as one more column, the
    residual stream it adds to; from ``R⁰ = [0 | I]``:

        M = C^self R^{l−1}
        R^l[i, :S] = Σ_s C^cross[i, s] R_enc[s, :] + C^cross[i, res] M[i, :S]
        R^l[i, S:] = C^cross[i, res] M[i, S:]

    Args:
        encoder: ``R_enc``.
        self_blocks: each decoder layer's ``C^self``, first layer first.
        cross_blocks: each decoder layer's ``C^cross`` (residual column last).

    Returns:
        ``R^L``: columns the source tokens, then the target tokens; each row sums to 1.

    Shape:
        encoder ``(B, S, S)``; self ``(B, T, T)``; cross ``(B, T, S + 1)`` → ``(B, T, S + T)``.
    """
    b, s = encoder.shape[0], encoder.shape[-1]
    t = self_blocks[0].shape[-1]
    r = torch.cat(
        [encoder.new_zeros(b, t, s), torch.eye(t, dtype=encoder.dtype).expand(b, t, t)], -1
    )  # R⁰: each target position is its own token
    for c_self, c_cross in zip(self_blocks, cross_blocks):
        m = c_self @ r  # through the self-attention block                  (B, T, S + T)
        keep = c_cross[:, :, s:]  # the residual's share                        (B, T, 1)
        source = c_cross[:, :, :s] @ encoder  # the encoder outputs' share     (B, T, S)
        r = torch.cat([source + keep * m[:, :, :s], keep * m[:, :, s:]], -1)
    return r
