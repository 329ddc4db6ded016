"""Root-mean-square layer normalisation (Zhang & Sennrich 2019), Llama's ``RMSNorm``."""

from __future__ import annotations

import torch
from torch import nn

from attnlab._checks import check_positive_int

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """``y = g ⊙ x / √(mean(x²) + ε)``: LayerNorm without the mean and the bias.

    The normalisation is computed in float32 (float64 for a float64 input) and cast back to the
    input's dtype before the gain, in the order Hugging Face's ``LlamaRMSNorm`` computes it, so a
    converted model gives the same numbers in fp32 and bf16. With an ``offset`` the gain is
    ``offset + g`` and the cast comes after it, as Gemma's ``(1 + g)`` norm computes it.

    Args:
        d_model: the normalised width.
        eps: ``ε``. Default 1e-6.
        offset: added to the gain (Gemma: 1; ``g`` then starts at ``1 − offset``). Default 0.

    Shape:
        ``(..., d_model)`` → ``(..., d_model)``.
    """

    def __init__(self, d_model: int, eps: float = 1e-6, offset: float = 0.0) -> None:
        super().__init__()
        d = check_positive_int("d_model", d_model)
        self.weight = nn.Parameter(torch.full((d,), 1.0 - offset))
        self.eps = float(eps)
        self.offset = float(offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension.

        Args:
            x: the input.

        Returns:
            The normalised input times the gain, in ``x``'s dtype.

        Shape:
            ``(..., d_model)`` → ``(..., d_model)``.
        """
        # y = g ⊙ x / √(mean(x²) + ε)
        wide = x.dtype in (torch.float32, torch.float64)  # no cast to do (a cast is a call)
        half = x.dtype in (torch.bfloat16, torch.float16)
        h = (
            x
            if wide
            else x.to(torch.float32 if half else torch.promote_types(x.dtype, torch.float32))
        )
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:  # y = (offset + g) ⊙ x̂, cast after the gain (Gemma)
            return (h * (self.weight.to(h.dtype) + self.offset)).to(x.dtype)
        return self.weight * (h if wide else h.to(x.dtype))

    def extra_repr(self) -> str:
        """The width and ``ε``, as ``print(model)`` shows them.

        Returns:
            ``"(d_model,), eps=…"``.
        """
        offset = f", offset={self.offset}" if self.offset else ""
        return f"{tuple(self.weight.shape)}, eps={self.eps}{offset}"
