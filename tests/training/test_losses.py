"""Label-smoothed cross-entropy against q'(k) = (1-ε)·q(k) + ε/V, ignoring padding."""

from __future__ import annotations

import pytest
import torch

from attnlab.training import label_smoothed_cross_entropy, token_loss

PAD = 0


def _reference(logits: torch.Tensor, targets: torch.Tensor, eps: float, pad: int) -> torch.Tensor:
    """Mean over non-pad positions of -Σ_k q'(k) log p(k), in the dtype of ``logits``."""
    V = logits.shape[-1]
    logp = torch.log_softmax(logits, dim=-1)
    q = torch.nn.functional.one_hot(targets.clamp(min=0), V).to(logits.dtype)
    q_smooth = (1 - eps) * q + eps / V  # q'(k) = (1-ε) q(k) + ε/V
    per_pos = -(q_smooth * logp).sum(-1)
    keep = targets != pad
    return per_pos[keep].sum() / keep.sum()


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 3, 4)])
def test_matches_smoothed_target_distribution(eps: float, shape: tuple[int, ...]) -> None:
    V = 9
    logits = torch.randn(*shape, V) * 3
    targets = torch.randint(1, V, shape)
    targets.view(-1)[::3] = PAD  # padding positions
    ref64 = _reference(logits.double(), targets, eps, PAD)
    base32 = _reference(logits, targets, eps, PAD)
    got = label_smoothed_cross_entropy(logits, targets, smoothing=eps, ignore_index=PAD)
    err_baseline = float((base32.double() - ref64).abs())
    err = float((got.double() - ref64).abs())
    assert err <= 2 * err_baseline + 1e-6
    out = token_loss(logits, targets, smoothing=eps, ignore_index=PAD)
    assert int(out.count) == int((targets != PAD).sum())
    assert torch.equal(out.loss, got)


def test_gradient_matches_reference() -> None:
    V, eps = 7, 0.2
    logits = torch.randn(4, 6, V, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(1, V, (4, 6))
    targets[:, -2:] = PAD
    (g_ref,) = torch.autograd.grad(_reference(logits, targets, eps, PAD), logits)
    (g,) = torch.autograd.grad(
        label_smoothed_cross_entropy(logits, targets, smoothing=eps, ignore_index=PAD), logits
    )
    assert torch.allclose(g, g_ref, rtol=0, atol=1e-12)
    assert float(g[:, -2:].abs().max()) == 0.0  # padding gets no gradient


def test_bf16_logits_reduce_in_float32() -> None:
    logits = torch.randn(4, 5, 50).bfloat16()
    targets = torch.randint(1, 50, (4, 5))
    got = label_smoothed_cross_entropy(logits, targets, smoothing=0.1, ignore_index=PAD)
    ref = _reference(logits.double(), targets, 0.1, PAD)
    assert got.dtype == torch.float32
    assert abs(float(got) - float(ref)) < 1e-5


def test_padding_does_not_change_the_loss() -> None:
    V = 5
    logits = torch.randn(2, 4, V)
    targets = torch.tensor([[1, 2, 3, 4], [2, 2, 1, 3]])
    padded_t = torch.cat([targets, torch.full((2, 3), PAD)], dim=1)
    padded_l = torch.cat([logits, torch.randn(2, 3, V) * 100], dim=1)
    a = label_smoothed_cross_entropy(logits, targets, smoothing=0.1, ignore_index=PAD)
    b = label_smoothed_cross_entropy(padded_l, padded_t, smoothing=0.1, ignore_index=PAD)
    assert torch.allclose(a, b, atol=1e-6)


def test_all_padding_is_zero_not_nan() -> None:
    logits = torch.randn(2, 3, 4, requires_grad=True)
    targets = torch.full((2, 3), PAD)
    out = token_loss(logits, targets, smoothing=0.1, ignore_index=PAD)
    assert float(out.loss.detach()) == 0.0 and int(out.count) == 0
    out.loss.backward()
    assert torch.isfinite(logits.grad).all() and float(logits.grad.abs().max()) == 0.0


def test_reductions() -> None:
    logits = torch.randn(3, 4, 6)
    targets = torch.randint(1, 6, (3, 4))
    targets[0, 0] = PAD
    none = label_smoothed_cross_entropy(
        logits, targets, smoothing=0.1, ignore_index=PAD, reduction="none"
    )
    assert none.shape == (3, 4) and float(none[0, 0]) == 0.0
    total = label_smoothed_cross_entropy(
        logits, targets, smoothing=0.1, ignore_index=PAD, reduction="sum"
    )
    assert torch.allclose(total, none.sum())
    mean = label_smoothed_cross_entropy(logits, targets, smoothing=0.1, ignore_index=PAD)
    assert torch.allclose(mean, total / 11)


def test_bad_input() -> None:
    with pytest.raises(
        ValueError, match=r"targets has shape \(3, 5\) but must be logits.shape\[:-1\] = \(3, 4\)"
    ):
        label_smoothed_cross_entropy(torch.randn(3, 4, 6), torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(TypeError, match=r"targets must hold integer class ids, got torch\.float32"):
        label_smoothed_cross_entropy(torch.randn(3, 6), torch.zeros(3))
    with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\), got 1.5"):
        label_smoothed_cross_entropy(
            torch.randn(3, 6), torch.zeros(3, dtype=torch.long), smoothing=1.5
        )
    with pytest.raises(ValueError, match="reduction must be one of"):
        label_smoothed_cross_entropy(
            torch.randn(3, 6), torch.zeros(3, dtype=torch.long), reduction="avg"
        )
