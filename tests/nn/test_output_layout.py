"""Every backend returns its output in the math backend's memory layout (contiguous).

After PyTorch's ``test_sdpa_backward_with_gradient`` (``test/test_transformers.py``), which fills
its upstream gradient with ``torch.empty_like(output).uniform_()``: ``empty_like`` keeps the
output's strides and ``uniform_`` fills memory in order, so an output laid out differently gets
other gradients from the same call. The blockwise backend's fused tiles used to return their
kernel's ``(B, T, H, D)`` memory layout.
"""

from __future__ import annotations

import pytest
import torch

import attnlab as al

BACKENDS = ["math", "sdpa", "blockwise", "blockwise_python"]
CASES = {
    "none": {},
    "causal": {"is_causal": True},
    "window": {"window": 8, "is_causal": True},
    "mask": {"mask": torch.rand(2, 1, 40, 40, generator=torch.Generator().manual_seed(0)) < 0.7},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_sdpa_backward_with_gradient(backend: str, case: str) -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 40, 16, generator=gen, dtype=torch.float64) for _ in "qkv")
    results = {}
    for name in ("math", backend):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = al.scaled_dot_product_attention(*inputs, backend=name, **CASES[case])
        grad = torch.empty_like(out).uniform_(generator=torch.Generator().manual_seed(2))
        results[name] = (out, torch.autograd.grad(out, inputs, grad))
    (ref, ref_grads), (out, grads) = results["math"], results[backend]
    assert out.stride() == ref.stride() and out.is_contiguous(), (out.stride(), ref.stride())
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)
