"""The ``"blockwise"`` backend: online softmax over key blocks, in pure PyTorch.

For each query row the softmax is accumulated one key block at a time (Milakov & Gimelshein 2018,
"Online normalizer calculation for softmax"; the forward of FlashAttention, Dao et al. 2022):

    m' = max(m, rowmax(S_b))                    running maximum
    l' = e^{m − m'} · l + rowsum(e^{S_b − m'})   running normaliser
    O' = e^{m − m'} · O + e^{S_b − m'} · V_b     running (unnormalised) output
    O  = O / l,   LSE = m + log l                at the end

The queries are tiled too (blocks of ``query_block`` rows), so that every temporary is a
``query_block × key_block`` tile per head; nothing of size ``T_q × T_k`` exists. Under a causal
mask a query block reads only the keys it may see: the keys every row of the block sees come in
unmasked blocks, and only the keys of the last block that cross the diagonal are masked. Keys
that no query of a block sees are never touched. Under a sliding window (``window=``) a query block
visits only the keys between its first row's window start and its last row's window end, so time
and memory grow as ``O(T · (w + query_block))``, and only the tiles the band cuts are masked (on
fused tiles, a window alone is gathered into one kernel call instead:
:mod:`attnlab.nn.backends.band_gather`). Under
a block layout (``block_mask=``, e.g. BigBird's) each query block of the layout visits only its
runs of visible key blocks: time and memory grow with the number of visible blocks.

The passes over each tile are kept few: the scale is folded into ``Q`` once instead of into every
tile, ``Kᵀ`` is laid out contiguously once, the exponentials are taken in place, and only the tile
that crosses the diagonal pays for a causal mask. Scores are formed in fp32 for half types (the
operands are upcast once): a half-precision ``Q Kᵀ`` overflows in fp16 and rounds in bf16.
Query blocks of 64 rows against key blocks of up to 8192 keys measured fastest on a 2-core CPU
(``benchmarks/attention.py``): few Python-level steps, and one rescaling of the running output per
query block at most lengths.

The backward pass (FlashAttention, Algorithm 2) recomputes each tile's weights from the saved
log-sum-exp, ``P_b = e^{S_b − LSE}``, and uses ``D = rowsum(dO ∘ O)``:

    dV_b = P_bᵀ dO,   dP_b = dO V_bᵀ,   dS_b = P_b ∘ (dP_b − D),   dQ += dS_b K_b · scale,
    dK_b = dS_bᵀ Q · scale
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab._checks import check_choice
from attnlab.errors import ArgumentError
from attnlab.nn.backends.band_gather import band_gather
from attnlab.nn.backends.common import compute_dtype, head_groups, mask_tile, repeat_kv
from attnlab.nn.backends.fused_tiles import FUSED_QUERY_BLOCK, fused_available, fused_tiles
from attnlab.nn.backends.plan import Tile, TilePlan
from attnlab.nn.mask_spec import Masking

QUERY_BLOCK = 64
KEY_BLOCK = 8192


def blockwise_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    masking: Masking,
    scale: float,
    dropout_p: float,
    need_weights: bool,
    block_size: int | None = None,
    query_block: int | None = None,
    tile_kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention with an online softmax over key blocks of ``block_size`` keys, for query blocks
    of ``query_block`` rows.

    With ``need_weights`` the exact weights are rebuilt from the log-sum-exp this pass computed
    (that, of course, is a ``T_q × T_k`` tensor).

    Args:
        query: the queries, validated by :func:`attnlab.scaled_dot_product_attention`.
        key: the keys; ``H`` is a multiple of ``H_kv`` (grouped-query attention).
        value: the values.
        masking: the normalised mask; every query row sees at least one key.
        scale: the score scale (``1 / √D`` by default upstream).
        dropout_p: dropout probability on the weights, in ``[0, 1)``; ``0.0`` for none.
        need_weights: also compute the attention weights (before dropout).
        block_size: keys per tile (default ``KEY_BLOCK``).
        query_block: query rows per block (default ``QUERY_BLOCK``; ``FUSED_QUERY_BLOCK`` for
            fused tiles without a window; a block layout uses its own block size).
        tile_kernel: how a tile is computed: ``"python"``, the online softmax written out in
            PyTorch (this module); ``"fused"``, PyTorch's fused CPU kernel per tile, merged by
            log-sum-exp (:mod:`attnlab.nn.backends.fused_tiles`); ``"auto"`` (default), fused
            where it computes the same (CPU, no dropout, no bias gradient), else python.

    Returns:
        ``(output, weights)``, ``weights`` being ``None`` unless ``need_weights``.

    Shape:
        as :func:`attnlab.nn.backends.math.math_attention`.
    """
    check_choice("tile_kernel", tile_kernel, ("auto", "fused", "python"))
    groups = head_groups(query, key)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    bias = masking.bias
    hidden = None if masking.allowed is None else ~masking.allowed
    fused = tile_kernel == "fused" or (
        tile_kernel == "auto" and fused_available(query, value, dropout_p, bias)
    )
    if fused and not fused_available(query, value, dropout_p, bias):
        raise ArgumentError(
            "tile_kernel='fused' needs CPU tensors, D_v = D, dropout_p=0 and a mask without "
            "gradient "
            "(and a PyTorch with the fused CPU kernel); use tile_kernel='auto' or 'python'"
        )
    if query_block is None:  # measured: a band's blocks stay small (each reads w + block keys)
        dense = masking.window is None and masking.blocks is None
        query_block = FUSED_QUERY_BLOCK if fused and dense else QUERY_BLOCK
    block_size = KEY_BLOCK if block_size is None else block_size
    band = _gathered_band(masking, query.shape[-2], key.shape[-2], fused, bias, hidden)
    if band is not None:  # the whole band in one kernel call (no per-block calls and copies)
        # blocks of QUERY_BLOCK rows measured fastest (T = 16384, window 256: 64 rows 0.11x of
        # full causal SDPA, 128 rows 0.13x, 256 rows 0.14x; benchmarks/window_copies.py)
        out, lse = band_gather(query, key, value, band, scale, query_block)
    elif fused:
        plan = _plan(query.shape[-2], key.shape[-2], masking, query_block, block_size)
        out, lse = fused_tiles(query, key, value, bias, hidden, plan, scale)
    else:
        plan = _plan(query.shape[-2], key.shape[-2], masking, query_block, block_size)
        seed = int(torch.randint(0, 2**62, (), device="cpu")) if dropout_p > 0 else 0
        out, lse = _Blockwise.apply(query, key, value, bias, hidden, plan, scale, dropout_p, seed)
    weights = None
    if need_weights:
        # P = exp(S − LSE), hidden entries 0: exactly the softmax the pass normalised by
        visible = masking.visible(query.shape[-2], key.shape[-2], query.device)
        acc = lse.dtype
        scores = torch.matmul(query.to(acc), key.to(acc).transpose(-2, -1)) * scale
        if bias is not None:
            scores = scores + bias
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        weights = torch.exp(scores - lse.unsqueeze(-1)).to(query.dtype)
    return out, weights


def _gathered_band(
    masking: Masking,
    t_q: int,
    t_k: int,
    fused: bool,
    bias: torch.Tensor | None,
    hidden: torch.Tensor | None,
) -> tuple[int, int] | None:
    """``(lo, hi)`` when a window alone, both sides bounded, runs on fused tiles: the band is then
    gathered into one kernel call (:mod:`attnlab.nn.backends.band_gather`); else ``None``."""
    if not fused or bias is not None or hidden is not None or masking.blocks is not None:
        return None
    if masking.window is None:
        return None
    lo, hi = masking.bounds(t_q, t_k)
    if lo is None or hi is None:
        return None
    return lo, hi


def _plan(t_q: int, t_k: int, masking: Masking, query_block: int, block_size: int) -> TilePlan:
    """The tiles the masking leaves: a block layout's visible blocks, a window's band, or all
    keys up to the causal diagonal."""
    if masking.blocks is not None:  # block-sparse: the visible tiles of the layout only
        bounds = None if masking.window is None else masking.bounds(t_q, t_k)
        return TilePlan.make_blocks(
            t_q, t_k, block_size, masking.blocks, masking.causal_offset, bounds
        )
    if masking.window is None:
        return TilePlan.make(t_q, t_k, query_block, block_size, masking.causal_offset)
    # the causal rule is part of the band's bounds
    return TilePlan.make_band(t_q, t_k, query_block, block_size, masking.bounds(t_q, t_k))


class _Operands:
    """The inputs laid out once for fast tiles: scaled queries and ``Kᵀ`` contiguous."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> None:
        self.acc = compute_dtype(q.dtype)
        # the scale folded into Q once, in the accumulation dtype (one rounding, like scaling
        # the scores); half types are upcast here, so that every tile's scores are fp32
        self.q = q.to(self.acc) * scale
        self.k_t = k.transpose(-2, -1).to(self.acc).contiguous()  # (..., D, T_k)
        self.v = v

    def scores(
        self,
        tile: Tile,
        bias: torch.Tensor | None,
        hidden: torch.Tensor | None,
        offset: int | None,
        band: tuple[int | None, int | None] | None = None,
    ) -> torch.Tensor:
        """``S_b = Q_b Kᵀ_b · scale + B_b`` with hidden entries at ``−∞``   (..., rows, cols)."""
        rows, cols = slice(tile.r0, tile.r1), slice(tile.j0, tile.j1)
        s = torch.matmul(self.q[..., rows, :], self.k_t[..., cols])
        if bias is not None:  # s has the full (..., H, rows, cols) shape; the bias broadcasts
            s = s.add_(mask_tile(bias, rows, cols))
        if hidden is not None:
            s = s.masked_fill_(mask_tile(hidden, rows, cols), float("-inf"))
        if offset is not None and tile.diagonal:  # only causal plans have diagonal tiles
            c0 = max(tile.j0, tile.mask_from)
            i = torch.arange(tile.r0, tile.r1, device=s.device)[:, None]
            j = torch.arange(c0, tile.j1, device=s.device)[None, :]
            s[..., c0 - tile.j0 :].masked_fill_(j > i + offset, float("-inf"))  # in place, a view
        if band is not None and tile.band:  # the sliding window cuts this tile
            lo, hi = band
            i = torch.arange(tile.r0, tile.r1, device=s.device)[:, None]
            j = torch.arange(tile.j0, tile.j1, device=s.device)[None, :]
            out = torch.zeros(s.shape[-2:], dtype=torch.bool, device=s.device)
            if lo is not None:
                out |= j < i + lo
            if hi is not None:
                out |= j > i + hi
            s = s.masked_fill_(out, float("-inf"))
        return s


def _keep_mask(
    shape: torch.Size, p: float, seed: int, index: int, device: torch.device
) -> torch.Tensor:
    """The dropout keep-mask of one tile, reproducible in the backward pass."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + index)
    return torch.rand(shape, generator=gen, device=device) >= p


class _Blockwise(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None,
        hidden: torch.Tensor | None,
        plan: TilePlan,
        scale: float,
        dropout_p: float,
        seed: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ops = _Operands(q, k, v, scale)
        acc = ops.acc
        lead = q.shape[:-1]
        out = torch.empty((*lead, v.shape[-1]), dtype=q.dtype, device=q.device)
        lse = torch.empty(lead, dtype=acc, device=q.device)
        # a row may see no key of a tile: the running maximum then stays −∞ (see m_safe)
        masked = bias is not None or hidden is not None or plan.band is not None
        index = 0
        for tiles in plan.blocks:
            rows = slice(tiles[0].r0, tiles[0].r1)
            # running statistics: max m, normaliser l, unnormalised output O   (..., rows, ·)
            m = torch.full(
                (*lead[:-1], rows.stop - rows.start, 1), float("-inf"), dtype=acc, device=q.device
            )
            norm = torch.zeros_like(m)
            o = torch.zeros((*m.shape[:-1], v.shape[-1]), dtype=acc, device=q.device)
            for tile in tiles:
                s = ops.scores(tile, bias, hidden, plan.causal_offset, plan.band)
                m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
                # a row with no visible key yet keeps m' = −∞: any finite shift will do
                m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0) if masked else m_new
                p = s.sub_(m_safe).exp_()  # e^{S_b − m'}
                alpha = torch.exp(m - m_safe)  # e^{m − m'} (0 on the first tile)
                l_b = p.sum(dim=-1, keepdim=True)
                if dropout_p > 0:
                    p = p.mul_(_keep_mask(p.shape, dropout_p, seed, index, q.device)).div_(
                        1 - dropout_p
                    )
                pv = torch.matmul(p.to(v.dtype), v[..., tile.j0 : tile.j1, :]).to(acc)
                norm.mul_(alpha).add_(l_b)
                o.mul_(alpha).add_(pv)
                m = m_new
                index += 1
            torch.div(o, norm, out=out[..., rows, :])  # O = O / l, written in place
            lse[..., rows] = (m + torch.log(norm)).squeeze(-1)  # LSE = m + log l
        ctx.save_for_backward(q, k, v, bias, hidden, out, lse)
        ctx.params = (plan, scale, dropout_p, seed)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor, _d_lse: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, bias, hidden, out, lse = ctx.saved_tensors
        plan, scale, dropout_p, seed = ctx.params
        ops = _Operands(q, k, v, scale)
        acc = ops.acc
        d_out_a = d_out.to(acc)
        delta = (d_out_a * out.to(acc)).sum(
            dim=-1, keepdim=True
        )  # D = rowsum(dO ∘ O)   (..., T_q, 1)
        lse = lse.unsqueeze(-1)
        v_t = v.transpose(-2, -1).to(acc).contiguous()  # (..., D_v, T_k)
        k_a, q_s = k.to(acc), ops.q
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=q.device)
        dv = torch.zeros(v.shape, dtype=acc, device=q.device)
        want_bias = bias is not None and ctx.needs_input_grad[3]
        dbias = torch.zeros(bias.shape, dtype=acc, device=q.device) if want_bias else None
        index = 0
        for tiles in plan.blocks:
            rows = slice(tiles[0].r0, tiles[0].r1)
            d_o, lse_b, delta_b = d_out_a[..., rows, :], lse[..., rows, :], delta[..., rows, :]
            q_b = q_s[..., rows, :]
            dq_b = torch.zeros_like(dq[..., rows, :])
            for tile in tiles:
                cols = slice(tile.j0, tile.j1)
                p = ops.scores(tile, bias, hidden, plan.causal_offset, plan.band)
                p = p.sub_(lse_b).exp_()  # P_b
                dp = torch.matmul(d_o, v_t[..., cols])  # dP_b = dO V_bᵀ
                if dropout_p > 0:
                    keep = _keep_mask(p.shape, dropout_p, seed, index, q.device).to(acc) / (
                        1 - dropout_p
                    )
                    dv[..., cols, :] += torch.matmul((p * keep).transpose(-2, -1), d_o)
                    dp.mul_(keep)
                else:
                    dv[..., cols, :] += torch.matmul(p.transpose(-2, -1), d_o)  # dV_b = P_bᵀ dO
                ds = p.mul_(dp.sub_(delta_b))  # dS_b = P_b ∘ (dP_b − D)
                dq_b += torch.matmul(ds, k_a[..., cols, :])
                dk[..., cols, :] += torch.matmul(ds.transpose(-2, -1), q_b)  # Q holds the scale
                if dbias is not None:
                    target = mask_tile(dbias, rows, cols)
                    target += ds.sum_to_size(target.shape)
                index += 1
            dq[..., rows, :] = dq_b
        dq.mul_(scale)
        return (
            dq.to(q.dtype),
            dk.to(k.dtype),
            dv.to(v.dtype),
            None if dbias is None else dbias.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )
