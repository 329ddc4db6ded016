"""The ``"blockwise"`` backend: online softmax over key blocks, in pure PyTorch.

For each query row the softmax is accumulated one key block at a time (Milakov & Gimelshein 2018,
"Online normalizer calculation for softmax"; the forward of FlashAttention, Dao et al. 2022):

    m' = max(m, rowmax(S_b))                    running maximum
    l' = e^{m − m'} · l + rowsum(e^{S_b − m'})   running normaliser
    O' = e^{m − m'} · O + e^{S_b − m'} · V_b     running (unnormalised) output
    O  = O / l,   LSE = m + log l                at the end

Nothing of size ``T_q × T_k`` exists: the largest temporary is ``T_q × block`` per head. Under a
causal mask a key block is read only by the query rows that may see some of it, and blocks that
no query sees are skipped. The backward pass (FlashAttention, Algorithm 2) recomputes each block's
weights from the saved log-sum-exp, ``P_b = e^{S_b − LSE}``, and uses ``D = rowsum(dO ∘ O)``:

    dV_b = P_bᵀ dO,   dP_b = dO V_bᵀ,   dS_b = P_b ∘ (dP_b − D),   dQ += dS_b K_b · scale,
    dK_b = dS_bᵀ Q · scale
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.nn.attention import Masking
from attnlab.nn.backends._common import compute_dtype, repeat_kv

BLOCK_SIZE = 256


def blockwise_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    masking: Masking,
    scale: float,
    dropout_p: float,
    need_weights: bool,
    block_size: int = BLOCK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention with an online softmax over key blocks of ``block_size``.

    With ``need_weights`` the exact weights are rebuilt from the log-sum-exp this pass computed
    (that, of course, is a ``T_q × T_k`` tensor).

    Shape:
        as :func:`attnlab.nn.backends.math.math_attention`.
    """
    groups = query.shape[-3] // key.shape[-3]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    seed = int(torch.randint(0, 2**62, (), device="cpu")) if dropout_p > 0 else 0
    bias = masking.bias
    out, lse = _Blockwise.apply(
        query, key, value, bias, masking.allowed, masking.causal_offset, scale, dropout_p, seed, block_size
    )
    weights = None
    if need_weights:
        # P = exp(S − LSE), hidden entries 0: exactly the softmax the pass normalised by
        visible = masking.visible(query.shape[-2], key.shape[-2], query.device)
        scores = torch.matmul(query, key.transpose(-2, -1)).to(lse.dtype) * scale
        if bias is not None:
            scores = scores + bias
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        weights = torch.exp(scores - lse.unsqueeze(-1)).to(query.dtype)
    return out, weights


def _slice(t: torch.Tensor | None, rows: slice, cols: slice) -> torch.Tensor | None:
    """Rows/cols of a mask that may be broadcast (size 1) along either of its last two dims."""
    if t is None:
        return None
    return t[..., rows if t.shape[-2] > 1 else slice(None), cols if t.shape[-1] > 1 else slice(None)]


class _Blocks:
    """The key blocks a pass visits and, for each, the first query row that may see it."""

    def __init__(self, t_q: int, t_k: int, block: int, causal_offset: int | None) -> None:
        self.items: list[tuple[int, int, int, bool]] = []  # (row0, col0, col1, needs causal mask)
        for j0 in range(0, t_k, block):
            j1 = min(j0 + block, t_k)
            if causal_offset is None:
                self.items.append((0, j0, j1, False))
                continue
            r0 = max(0, j0 - causal_offset)  # rows i < r0 see no key of this block
            if r0 >= t_q:
                break
            crosses = (j1 - 1) > r0 + causal_offset  # some (row, key) pair in it is in the future
            self.items.append((r0, j0, j1, crosses))
        self.causal_offset = causal_offset


def _block_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    bias: torch.Tensor | None,
    allowed: torch.Tensor | None,
    blocks: _Blocks,
    item: tuple[int, int, int, bool],
    scale: float,
    acc: torch.dtype,
) -> torch.Tensor:
    """``S_b = Q Kᵀ_b · scale + B_b`` with hidden entries at ``−∞``  (..., H, T_q − r0, j1 − j0)."""
    r0, j0, j1, crosses = item
    rows, cols = slice(r0, None), slice(j0, j1)
    s = torch.matmul(q[..., rows, :], k[..., cols, :].transpose(-2, -1)).to(acc)
    s.mul_(scale)
    b = _slice(bias, rows, cols)
    if b is not None:
        s = s + b
    vis = _slice(allowed, rows, cols)
    if crosses:
        assert blocks.causal_offset is not None
        i = torch.arange(r0, q.shape[-2], device=q.device)[:, None]
        j = torch.arange(j0, j1, device=q.device)[None, :]
        causal = j <= i + blocks.causal_offset
        vis = causal if vis is None else vis & causal
    if vis is not None:
        s = s.masked_fill(~vis, float("-inf"))
    return s


def _keep_mask(shape: torch.Size, p: float, seed: int, index: int, device: torch.device) -> torch.Tensor:
    """The dropout keep-mask of one block, reproducible in the backward pass."""
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
        allowed: torch.Tensor | None,
        causal_offset: int | None,
        scale: float,
        dropout_p: float,
        seed: int,
        block: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        acc = compute_dtype(q.dtype)
        t_q, t_k = q.shape[-2], k.shape[-2]
        blocks = _Blocks(t_q, t_k, block, causal_offset)
        lead = q.shape[:-1]
        m = torch.full(lead, float("-inf"), dtype=acc, device=q.device)  # running max
        l = torch.zeros(lead, dtype=acc, device=q.device)  # running normaliser
        o = torch.zeros((*lead, v.shape[-1]), dtype=acc, device=q.device)  # running output
        for index, item in enumerate(blocks.items):
            r0, j0, j1, _ = item
            s = _block_scores(q, k, bias, allowed, blocks, item, scale, acc)
            m_old = m[..., r0:]
            m_new = torch.maximum(m_old, s.amax(dim=-1))
            m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # rows with no key yet
            p = s.sub_(m_safe.unsqueeze(-1)).exp_()  # e^{S_b − m'}
            alpha = torch.exp(m_old - m_safe)  # e^{m − m'}
            l[..., r0:] = alpha * l[..., r0:] + p.sum(dim=-1)
            if dropout_p > 0:
                p = p * _keep_mask(p.shape, dropout_p, seed, index, q.device) / (1.0 - dropout_p)
            pv = torch.matmul(p.to(v.dtype), v[..., j0:j1, :]).to(acc)
            o[..., r0:, :] = alpha.unsqueeze(-1) * o[..., r0:, :] + pv
            m[..., r0:] = m_new
        o = o / l.unsqueeze(-1)
        lse = m + torch.log(l)
        out = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, bias, allowed, out, lse)
        ctx.params = (blocks, scale, dropout_p, seed)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor, _d_lse: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, bias, allowed, out, lse = ctx.saved_tensors
        blocks, scale, dropout_p, seed = ctx.params
        acc = lse.dtype
        d_out_a = d_out.to(acc)
        delta = (d_out_a * out.to(acc)).sum(dim=-1)  # D = rowsum(dO ∘ O)   (..., H, T_q)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=q.device)
        dv = torch.zeros(v.shape, dtype=acc, device=q.device)
        want_bias = bias is not None and ctx.needs_input_grad[3]
        dbias = torch.zeros(bias.shape, dtype=acc, device=q.device) if want_bias else None
        for index, item in enumerate(blocks.items):
            r0, j0, j1, _ = item
            s = _block_scores(q, k, bias, allowed, blocks, item, scale, acc)
            p = s.sub_(lse[..., r0:].unsqueeze(-1)).exp_()  # P_b = e^{S_b − LSE}
            d_o = d_out_a[..., r0:, :]
            v_b = v[..., j0:j1, :].to(acc)
            dp = torch.matmul(d_o, v_b.transpose(-2, -1))  # dP_b = dO V_bᵀ
            if dropout_p > 0:
                keep = _keep_mask(p.shape, dropout_p, seed, index, q.device).to(acc) / (1.0 - dropout_p)
                dv_b = torch.matmul((p * keep).transpose(-2, -1), d_o)
                dp = dp * keep
            else:
                dv_b = torch.matmul(p.transpose(-2, -1), d_o)  # dV_b = P_bᵀ dO
            ds = p.mul_(dp.sub_(delta[..., r0:].unsqueeze(-1)))  # dS_b = P_b ∘ (dP_b − D)
            dv[..., j0:j1, :] += dv_b
            dq[..., r0:, :] += torch.matmul(ds, k[..., j0:j1, :].to(acc)) * scale
            dk[..., j0:j1, :] += torch.matmul(ds.transpose(-2, -1), q[..., r0:, :].to(acc)) * scale
            if dbias is not None:
                target = _slice(dbias, slice(r0, None), slice(j0, j1))
                assert target is not None
                target += ds.sum_to_size(target.shape)
        return (
            dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
            None if dbias is None else dbias.to(bias.dtype),
            None, None, None, None, None, None,
        )
