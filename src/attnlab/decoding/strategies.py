"""Choosing the next token from the logits: greedy, and sampling with temperature, top-k, top-p.

All functions work on the logits of the last position, ``(N, V)``, and return new tensors.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError

__all__ = [
    "greedy_choice",
    "sample_choice",
    "sampling_distribution",
    "top_k_filter",
    "top_p_filter",
]


def at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` in float32, or in their own dtype when it is wider (float64 stays float64).

    Shape:
        any → the same.
    """
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def greedy_choice(logits: torch.Tensor) -> torch.Tensor:
    """The most likely token of each row (the first one on ties, as ``torch.argmax``).

    Args:
        logits: ``(N, V)``.

    Returns:
        token ids ``(N,)``.

    Shape:
        logits ``(N, V)`` → ``(N,)``; ``N`` rows (batch × beams), ``V`` the vocabulary size.
    """
    return logits.argmax(dim=-1)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits of each row and set the others to ``-inf``.

    Ties at the ``k``-th value are all kept (the filter is ``logit >= k-th largest``), as in
    Hugging Face's ``TopKLogitsWarper``.

    Args:
        logits: ``(N, V)``.
        k: how many to keep; ``k >= V`` keeps everything.

    Returns:
        filtered logits ``(N, V)``.

    Shape:
        logits ``(N, V)`` → ``(N, V)``; ``N`` rows, ``V`` the vocabulary size.
    """
    check_positive_int("top_k", k)
    if k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]  # (N, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keep the smallest set of most likely tokens whose
    probabilities sum to at least ``p``; set the others to ``-inf``.

    With the probabilities sorted in decreasing order, ``π_(1) ≥ π_(2) ≥ …``, token ``(i)`` is kept
    when the mass before it is below ``p``:

        keep (i)  ⇔  Σ_{j < i} π_(j) < p

    so the most likely token is always kept.

    Args:
        logits: ``(N, V)``.
        p: the probability mass to keep, in ``(0, 1]``; ``1`` keeps everything.

    Returns:
        filtered logits ``(N, V)``.

    Shape:
        logits ``(N, V)`` → ``(N, V)``; ``N`` rows, ``V`` the vocabulary size.
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < float(p) <= 1.0:
        raise ArgumentError(f"top_p must be a float in (0, 1], got {p!r}")
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (N, V)
    probs = at_least_float32(sorted_logits).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # Σ_{j < i} π_(j)
    remove_sorted = mass_before >= p
    remove = remove_sorted.scatter(-1, order, remove_sorted)  # back to vocabulary order
    return logits.masked_fill(remove, float("-inf"))


def sampling_distribution(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """The distribution a token is sampled from: ``softmax(logits / temperature)`` after top-k
    then top-p filtering (the order Hugging Face applies them), in float32 (float64 logits stay
    float64). :func:`sample_choice` draws from exactly this tensor.

        π = softmax(filter(z / τ))

    Args:
        logits: ``(N, V)``.
        temperature: ``τ > 0``; below 1 sharpens, above 1 flattens the distribution.
        top_k: keep only the ``k`` most likely tokens, or ``None``.
        top_p: keep the nucleus of mass ``p``, or ``None``.

    Returns:
        probabilities ``(N, V)``, zero on the filtered tokens.

    Shape:
        logits ``(N, V)`` → ``(N, V)``; ``N`` rows, ``V`` the vocabulary size.
    """
    z = at_least_float32(logits) / temperature
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = top_p_filter(z, top_p)
    return z.softmax(dim=-1)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row drawn from ``probs`` (``torch.multinomial``).

    Shape:
        probs ``(N, V)`` → token ids ``(N,)``.
    """
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample_choice(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw one token per row from :func:`sampling_distribution`,
    ``π = softmax(filter(logits / τ))``.

    Args:
        logits: ``(N, V)``.
        temperature: ``τ > 0``; below 1 sharpens, above 1 flattens the distribution.
        top_k: keep only the ``k`` most likely tokens, or ``None``.
        top_p: keep the nucleus of mass ``p``, or ``None``.
        generator: a seeded ``torch.Generator`` for reproducible draws.

    Returns:
        token ids ``(N,)``.

    Shape:
        logits ``(N, V)`` → ``(N,)``; ``N`` rows, ``V`` the vocabulary size.
    """
    probs = sampling_distribution(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return draw(probs, generator)
