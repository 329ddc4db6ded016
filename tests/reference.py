"""Float64 references and the flash-attention error rule, shared by the tests.

``attention_ref`` is the attention equation written as plainly as possible. Called with
``upcast=True`` it computes in float64 (the reference); with ``upcast=False`` it computes in the
inputs' dtype and is the *baseline*: the error a plain PyTorch implementation makes in that dtype.
A backend passes when ``err(backend) <= 2 * err(baseline) + floor`` (Dao et al., flash-attention's
test suite), for outputs and for gradients.
"""

from __future__ import annotations

import torch

__all__ = [
    "FLOOR",
    "assert_close_rule",
    "attention_ref",
    "max_err",
    "visible_mask",
]

# the "tiny floor" of the rule, per dtype (a few ulps at the magnitudes the tests use)
FLOOR = {
    torch.float64: 1e-12,
    torch.float32: 2e-6,
    torch.bfloat16: 4e-3,
    torch.float16: 1e-3,
}


def visible_mask(
    t_q: int,
    t_k: int,
    mask: torch.Tensor | None,
    is_causal: bool,
    device: torch.device | str = "cpu",
) -> torch.Tensor | None:
    """Where a query may attend: the boolean/additive ``mask`` and the bottom-right causal rule."""
    vis = None
    if mask is not None:
        vis = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
    if is_causal:
        i = torch.arange(t_q, device=device)[:, None]
        j = torch.arange(t_k, device=device)[None, :]
        causal = j <= i + (t_k - t_q)
        vis = causal if vis is None else vis & causal
    return vis


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    upcast: bool = True,
    keep: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(Q Kᵀ · scale + M) V`` with fully hidden rows giving zeros.

    Args:
        q, k, v: ``(..., H, T_q, D)``, ``(..., H_kv, T_k, D)``, ``(..., H_kv, T_k, D_v)``.
        mask: boolean (True = attend) or additive float mask broadcastable to ``(..., H, T_q, T_k)``.
        is_causal: bottom-right causal masking, on top of ``mask``.
        scale: default ``1 / √D``.
        upcast: compute in float64 (reference) or in the inputs' dtype (baseline).
        keep: optional dropout keep-mask (applied as ``P ∘ keep / (1 − dropout_p)``).

    Returns:
        ``(output, weights)`` in the inputs' dtype (``upcast=False``) or float64.
    """
    dtype = torch.float64 if upcast else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    groups = q.shape[-3] // k.shape[-3]
    k = k.repeat_interleave(groups, dim=-3)
    v = v.repeat_interleave(groups, dim=-3)
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    vis = visible_mask(t_q, t_k, mask, is_causal, q.device)
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask.to(dtype).masked_fill(~vis if vis is not None else False, 0.0)
    if vis is not None:
        vis = vis.expand(scores.shape)
        scores = scores.masked_fill(~vis, float("-inf"))
        empty = ~vis.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(empty, 0.0)  # any finite row: the weights are zeroed below
    weights = torch.softmax(scores, dim=-1)
    if vis is not None:
        weights = weights * vis
    dropped = weights if keep is None else weights * keep / (1.0 - dropout_p)
    if vis is not None:
        # hidden values never reach the output (0 · NaN would): zero them where no weight looks
        v = torch.where(vis.any(dim=-2).unsqueeze(-1), v, torch.zeros((), dtype=dtype))
    out = torch.matmul(dropped, v)
    return out, weights


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference, in float64."""
    return float((a.detach().double() - b.detach().double()).abs().max())


def assert_close_rule(
    got: torch.Tensor,
    ref: torch.Tensor,
    baseline: torch.Tensor,
    what: str = "output",
    factor: float = 2.0,
) -> None:
    """``|got − ref| <= factor · |baseline − ref| + floor`` (max norms); no NaN anywhere."""
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    assert not torch.isnan(got).any(), f"{what}: NaN in result"
    err = max_err(got, ref)
    base = max_err(baseline, ref)
    floor = FLOOR[got.dtype]
    assert err <= factor * base + floor, (
        f"{what}: error {err:.3g} > {factor} x baseline {base:.3g} + {floor:g} ({got.dtype})"
    )
