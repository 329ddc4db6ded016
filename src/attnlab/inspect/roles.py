"""Head-role scores: previous-token, duplicate-token, induction and copying heads.

The standard test of Olsson et al. (2022, "In-context Learning and Induction Heads", §2 and
Appendix "Head activation evaluators"): a sequence of random tokens ``r`` of length ``n``, repeated
once, ``x = [bos] + r + r`` (the ``bos`` optional). On it every head of every layer gets three
attention scores, read from its exact attention weights ``A`` ``(B, H, T, T)``
(:func:`attnlab.inspect.capture`), and one weight score, read from its OV circuit:

- **previous-token**: the weight on the token just before, ``mean_{t ≥ 1} A[t, t − 1]``;
- **duplicate-token**: the weight on the earlier occurrences of the same token,
  ``mean_t Σ_{s < t, x_s = x_t} A[t, s]`` over the positions ``t`` that have one (the second
  copy of ``r``: ``s = t − n``);
- **induction** (prefix matching): the weight on the token *after* an earlier occurrence,
  ``mean_t Σ_{s + 1 < t, x_s = x_t} A[t, s + 1]`` (``s + 1 = t − n + 1``);
- **copying** (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits", the OV
  circuit ``W_U W_O^h W_V^h W_E``): whether what the head writes when it attends to token ``x``
  raises the logit of ``x`` itself — the fraction of the repeated tokens whose own logit is among
  the ``k`` largest (default 5) of the OV circuit's logits over the repeated tokens (the top-k
  accuracy of the "full OV circuit" of ARENA's induction-head exercises).

The three attention scores are TransformerLens' ``detect_head`` patterns
(``previous_token_head``, ``duplicate_token_head``, ``induction_head``: every earlier occurrence
counts, and an induction target is never the current token) with one difference in the average:
TransformerLens divides the weight on the pattern by the weight of *all* ``T`` rows, so rows with
no target (the first copy of ``r``) pull its scores down; here the mean is over the rows that
have a target, so a perfect head scores 1 (TransformerLens' score = this score × rows with a
target / ``T``). The tokens of ``r`` are drawn *without replacement*, so a token of ``r`` occurs
once in each copy and the duplicate and induction targets are exactly ``t − n`` and ``t − n + 1``.

**The BOS convention.** The scores depend on whether a begin-of-sequence token comes first:
with none, the first random token is where a head parks unused weight (its attention sink);
with one, the BOS is. TransformerLens prepends the tokenizer's BOS by default
(``HookedTransformer(default_prepend_bos=True)``, ``to_tokens(prepend_bos=True)``), so published
TransformerLens scores are measured on ``[bos] + r + r``; Olsson et al.'s plain test, and this
module's default (``bos=None``), on ``r + r``. On SmolLM2-135M (``seq_len`` 50, batch 8, seed 0)
its tokenizer's BOS (id 1) moves single heads by at most 0.07, ``<|endoftext|>`` (id 0) first by
up to 0.28 (layer 8 head 0, duplicate 0.71 → 0.43); the top heads stay on top. :attr:`HeadRoles.convention`
names the one used; ``attnlab inspect --roles`` chooses it with ``--roles-bos
{none,tokenizer,ID}``. The tokens of ``r`` are the same either way (same seed, same range): a BOS
moves every position by one and nothing else — unless the BOS id lies in ``token_range`` and is
drawn into ``r``, when its occurrences count as earlier occurrences like any other token.

Examples:
    >>> model, tokenizer = attnlab.load_pretrained("smollm2-135m")
    >>> roles = head_roles(model, seq_len=50, batch=4, token_range=(17, 49152))
    >>> roles.top("induction", 3)
    [(3, 'transformer.h.3.attn', 1, 0.91), ...]
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab._budget import check_fits
from attnlab._checks import shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.capture import capture_attention
from attnlab.inspect.qk_circuits import head_weights
from attnlab.models.gpt import GPT
from attnlab.nn.multihead import MultiHeadAttention

__all__ = [
    "ROLES",
    "HeadRoles",
    "copying_scores",
    "head_roles",
    "load_head_roles",
    "ordinary_token_range",
    "repeated_tokens",
    "role_scores",
]

#: the scores :func:`head_roles` computes, in the order they are shown
ROLES = ("previous", "duplicate", "induction", "copying")

#: the longest repeated sequence (tokens per copy) :func:`head_roles` accepts
MAX_SEQ_LEN = 4096
#: the most random sequences :func:`head_roles` averages over (the scores settle long before;
#: each sequence costs a forward and its attention weights)
MAX_BATCH = 4096


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        where = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ArgumentError(f"{name} must be {where}, got {value}")
    return value


def _check_range(token_range: object, vocab_size: int, n: int) -> tuple[int, int]:
    """``token_range`` as ``(lo, hi)`` with ``0 ≤ lo``, ``hi ≤ vocab_size``, ``n`` ids between."""
    if (
        not isinstance(token_range, Sequence)
        or len(token_range) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in token_range)
    ):
        raise ArgumentTypeError(f"token_range must be a pair of ints (lo, hi), got {token_range!r}")
    lo, hi = int(token_range[0]), int(token_range[1])
    if not 0 <= lo < hi <= vocab_size:
        raise ArgumentError(
            f"token_range must satisfy 0 <= lo < hi <= vocab_size = {vocab_size}, got ({lo}, {hi})"
        )
    if hi - lo < n:
        raise ArgumentError(
            f"token_range ({lo}, {hi}) holds {hi - lo} ids, fewer than the {n} distinct tokens of "
            f"one sequence (seq_len); widen it or lower seq_len"
        )
    return lo, hi


def ordinary_token_range(vocab_size: int, special_ids: Sequence[int] = ()) -> tuple[int, int]:
    """The longest run of ids without a special token: where random tokens are drawn from.

    Args:
        vocab_size: the number of ids.
        special_ids: ids to avoid (a tokenizer's added special tokens, ``bos``, ``eos`` …).

    Returns:
        ``(lo, hi)``: ids ``lo ≤ i < hi``, none of them special; the first such run when several
        are equally long. SmolLM2 (special ids 0–16 of 49152) gives ``(17, 49152)``, GPT-2
        (``<|endoftext|>`` = 50256) ``(0, 50256)``.

    Raises:
        ValueError: every id is special.
    """
    _check_int("vocab_size", vocab_size, 1)
    cuts = sorted({int(i) for i in special_ids if 0 <= int(i) < vocab_size})
    best, start = (0, 0), 0
    for cut in [*cuts, vocab_size]:
        if cut - start > best[1] - best[0]:
            best = (start, cut)
        start = cut + 1
    if best[1] == best[0]:
        raise ArgumentError(f"every one of the {vocab_size} ids is a special token")
    return best


def repeated_tokens(
    seq_len: int,
    *,
    batch: int = 8,
    token_range: tuple[int, int],
    bos: int | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """The standard input of the role scores: ``[bos] + r + r`` per row (Olsson et al. 2022).

    ``r`` holds ``seq_len`` distinct ids drawn uniformly, without replacement, from
    ``token_range``, by a generator seeded with ``seed`` (the same call gives the same tokens).

    Args:
        seq_len: ``n``, the length of ``r``.
        batch: the number of sequences. Default 8.
        token_range: ``(lo, hi)``: ids ``lo ≤ i < hi`` (see :func:`ordinary_token_range`).
        bos: an id put first in every row, or ``None`` (default) for none.
        seed: the generator's seed. Default 0.

    Returns:
        The token ids (int64, CPU).

    Raises:
        ValueError: ``seq_len`` or ``batch`` below 1, or ``token_range`` holds fewer than
            ``seq_len`` ids.
        TypeError: arguments of the wrong type.

    Shape:
        ``(batch, 2 · seq_len + 1)`` with ``bos``, else ``(batch, 2 · seq_len)``.
    """
    n = _check_int("seq_len", seq_len, 1)
    b = _check_int("batch", batch, 1)
    _check_int("seed", seed, 0, 2**63 - 1)
    lo, hi = _check_range(token_range, 2**62, n)
    first = [] if bos is None else [_check_int("bos", bos, 0)]
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(b):
        r = _distinct(lo, hi, n, g)  # n distinct ids, uniformly drawn                (n,)
        rows.append(torch.cat([torch.tensor(first, dtype=torch.long), r, r]))  # [bos] + r + r
    return torch.stack(rows)  # (B, [1 +] 2n)


def _distinct(lo: int, hi: int, n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` distinct ids of ``[lo, hi)`` in random order, each subset equally likely.

    Shape:
        ``(n,)`` int64.
    """
    if hi - lo <= max(1 << 22, 4 * n):  # a permutation of the range
        return torch.randperm(hi - lo, generator=g)[:n] + lo
    seen: dict[int, None] = {}  # a wide range: draw until n distinct (rarely more than n draws)
    while len(seen) < n:
        for v in torch.randint(lo, hi, (n,), generator=g).tolist():
            if len(seen) < n:
                seen.setdefault(int(v))
    return torch.tensor(list(seen), dtype=torch.long)


def _pattern_scores(weights: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``mean over the rows with a target of Σ_s A[t, s] · target[t, s]``, per head.

    Shape:
        weights ``(B, H, T, T)``, target ``(B, T, T)`` bool → ``(H,)`` float64.
    """
    rows = target.any(-1)  # (B, T): queries that have a target
    if not bool(rows.any()):
        return torch.full((weights.shape[1],), float("nan"), dtype=torch.float64)
    on = (weights.double() * target[:, None].double()).sum(-1)  # (B, H, T)
    return (on * rows[:, None]).sum((0, 2)) / rows.sum()  # (H,)


def role_scores(weights: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Previous-token, duplicate-token and induction scores of one layer's heads.

    With ``x`` the tokens and ``A`` one head's weights (each row a distribution over the keys):

        previous(h)  = mean_{t ≥ 1} A[t, t − 1]
        duplicate(h) = mean_{t ∈ D} Σ_{s < t, x_s = x_t} A[t, s]
        induction(h) = mean_{t ∈ I} Σ_{s + 1 < t, x_s = x_t} A[t, s + 1]

    where ``D`` (``I``) are the rows with at least one target, and the means run over the batch
    too (every such row counts once). On ``[bos] + r + r`` with ``r`` of distinct tokens the
    targets are ``t − n`` and ``t − n + 1`` for the second copy. A score with no row to average
    (e.g. no token repeats) is NaN.

    Args:
        weights: one layer's attention weights (exact softmax weights, rows summing to 1).
        tokens: the token ids the layer's input came from.

    Returns:
        ``{"previous": …, "duplicate": …, "induction": …}``, one float64 value per head.

    Raises:
        ValueError: the shapes do not match, or ``T < 2``.
        TypeError: ``weights`` is not a floating tensor or ``tokens`` not an integer one.

    Shape:
        weights ``(B, H, T, T)``, tokens ``(B, T)`` → each score ``(H,)``.

    Examples:
        >>> w = torch.zeros(1, 1, 4, 4); w[0, 0, 0, 0] = 1; w[0, 0, 1:, :3] = torch.eye(3)
        >>> role_scores(w, torch.tensor([[5, 6, 5, 6]]))["previous"]
        tensor([1.], dtype=torch.float64)
    """
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
        raise ArgumentTypeError(f"weights must be a floating tensor, got {type(weights).__name__}")
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.is_complex():
        raise ArgumentTypeError("tokens must be an integer tensor of token ids")
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ArgumentError(
            f"weights must be (B, H, T, T) self-attention weights, got {shape_str(weights.shape)}"
        )
    b, _, t, _ = weights.shape
    if tokens.shape != (b, t):
        raise ArgumentError(
            f"tokens must be (B, T) = ({b}, {t}) to match the weights, got {shape_str(tokens.shape)}"
        )
    if t < 2:
        raise ArgumentError(f"the role scores need at least 2 positions, got T = {t}")
    tokens = tokens.to(weights.device)
    q = torch.arange(t, device=weights.device)
    earlier = q[None, :] < q[:, None]  # (T, T): s < t
    # previous: target s = t − 1 for t ≥ 1
    previous = (q[None, :] == q[:, None] - 1).expand(b, t, t)  # (B, T, T)
    # duplicate: earlier positions holding the same token, x_s = x_t, s < t
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, T, T)
    duplicate = same & earlier
    # induction: the position after each earlier occurrence, s + 1, never the current token
    induction = torch.zeros_like(duplicate)
    induction[:, :, 1:] = duplicate[:, :, :-1]
    induction &= earlier
    return {
        "previous": _pattern_scores(weights, previous),
        "duplicate": _pattern_scores(weights, duplicate),
        "induction": _pattern_scores(weights, induction),
    }


def _linear_part(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``N(x) − N(0)``: a norm without its bias — for LayerNorm and RMSNorm its gain (and
    LayerNorm's centring) times a positive factor per row.

    Shape:
        x ``(..., d_model)`` → ``(..., d_model)``.
    """
    n64 = copy.deepcopy(norm).to(torch.float64)
    return n64(x) - n64(torch.zeros_like(x[..., :1, :]))


@torch.no_grad()
def copying_scores(model: GPT, tokens: torch.Tensor, *, top_k: int = 5) -> torch.Tensor:
    """The copying score of every head's OV circuit on a set of tokens.

    For each token ``x`` of the set ``S`` (the distinct ids of ``tokens``), head ``h`` of layer
    ``l`` (key/value group ``g = h // (H / H_kv)``) writes, when it attends to ``x`` alone,

        o_h(x) = W_O^h W_V^g N_1(W_E[x])            logits_h(x) = W_U N_f(o_h(x))

    (Elhage et al. 2021: the OV circuit ``W_U W_O^h W_V^h W_E``), with ``N_1`` the block's
    ``ln_1`` and ``N_f`` the final ``ln_f``, each without its bias (``N(y) − N(0)``: the gain,
    and LayerNorm's centring, times a positive factor that does not change the ranking). The
    biases of V and O, and the norms', add the same vector whatever ``x`` is and are not part of
    the token-to-token map; a learned position embedding is left out. The score is the fraction
    of ``x ∈ S`` whose own logit is among the ``top_k`` largest of ``logits_h(x)`` restricted to
    ``S``:

        copying(l, h) = mean_{x ∈ S} 1[#{y ∈ S, y ≠ x : logits_h(x)_y ≥ logits_h(x)_x} < top_k]

    (ties count against ``x``: a head that writes nothing copies nothing). Chance is
    ``top_k / |S|``. Computed in float64.

    Args:
        model: an :class:`attnlab.GPT` (any family; grouped-query heads read their group's W_V).
        tokens: the ids whose OV circuit is scored (e.g. the repeated tokens; duplicates count
            once).
        top_k: how many of the largest logits count as copying. Default 5.

    Returns:
        The scores in ``[0, 1]``, float64.

    Raises:
        ValueError: ``top_k`` below 1, an id outside the vocabulary, or fewer than 2 distinct ids.
        TypeError: ``model`` is not an ``attnlab.GPT``.

    Shape:
        tokens: any shape → ``(n_layer, n_head)``.
    """
    if not isinstance(model, GPT):
        raise ArgumentTypeError(f"model must be an attnlab.GPT, got {type(model).__name__}")
    k = _check_int("top_k", top_k, 1)
    cfg = model.config
    ids = torch.unique(tokens.detach().flatten().cpu())
    if ids.numel() < 2:
        raise ArgumentError(
            f"the copying score needs at least 2 distinct tokens, got {ids.numel()}"
        )
    if int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
        raise ArgumentError(f"tokens must lie in [0, vocab_size = {cfg.vocab_size})")
    device = model.transformer.wte.weight.device
    ids = ids.to(device)
    embed = model.transformer.wte.weight[ids].double()  # W_E[x]                       (N, d)
    unembed = model.lm_head.weight[ids].double()  # W_U restricted to S                (N, d)
    ln_f = model.transformer.ln_f
    scores = torch.empty(cfg.n_layer, cfg.n_head, dtype=torch.float64)
    for i, block in enumerate(model.transformer.h):
        attn, ln_1 = block.attn, block.ln_1
        if not isinstance(attn, MultiHeadAttention) or not isinstance(ln_1, nn.Module):
            raise ArgumentTypeError(f"block {i} has no attention layer with query/key/value heads")
        x = _linear_part(ln_1, embed)  # N_1(W_E[x])                                 (N, d)
        w = head_weights(attn)  # W_V of head h's group g = h // (H / H_kv), and W_O^h
        v = torch.einsum("nd,hed->nhe", x, w.value.double())  # W_V^g N_1(W_E[x])  (N, H, d_head)
        # o_h(x) = W_O^h W_V^g N_1(W_E[x])                                           (H, N, d)
        o = torch.einsum("nhe,hde->hnd", v, w.output.double())
        # logits_h(x) = W_U N_f(o_h(x)), over the tokens of S                       (H, N, N)
        logits = _linear_part(ln_f, o) @ unembed.T
        own = logits.diagonal(dim1=-2, dim2=-1)  # logits_h(x)_x                          (H, N)
        # tokens ranked above x, ties counted against it (an OV circuit of zeros copies nothing)
        above = (logits >= own[..., None]).sum(-1) - 1  #                                 (H, N)
        scores[i] = (above < k).double().mean(-1).cpu()
    return scores


@dataclass
class HeadRoles:
    """The role scores of every head of a model (:func:`head_roles`).

    Attributes:
        previous: previous-token score per layer and head, in ``[0, 1]``.
        duplicate: duplicate-token score.
        induction: induction (prefix-matching) score.
        copying: copying score of the OV circuit (fraction of the repeated tokens in their own
            top-``top_k``).
        layers: the attention layers' module paths, one per row.
        tokens: the input the scores were measured on, ``[bos] + r + r`` per row.
        seq_len: ``n``, the length of ``r``.
        bos: the first id of each row, or ``None`` (see :attr:`convention`).
        token_range: ``(lo, hi)`` the tokens of ``r`` were drawn from.
        seed: the generator's seed.
        top_k: the ``k`` of the copying score.

    Shape:
        each score ``(n_layer, n_head)`` float64; tokens ``(B, [1 +] 2 · seq_len)``.
    """

    previous: torch.Tensor
    duplicate: torch.Tensor
    induction: torch.Tensor
    copying: torch.Tensor
    layers: list[str]
    tokens: torch.Tensor
    seq_len: int
    bos: int | None = None
    token_range: tuple[int, int] = (0, 0)
    seed: int = 0
    top_k: int = 5

    @property
    def convention(self) -> str:
        """The BOS convention in words: ``"no BOS: r + r"`` or ``"BOS id 1 first: [bos] + r +
        r"`` (TransformerLens' default is a BOS; see the module docstring)."""
        if self.bos is None:
            return "no BOS: r + r"
        return f"BOS id {self.bos} first: [bos] + r + r"

    def score(self, name: str) -> torch.Tensor:
        """One score's matrix by name.

        Args:
            name: one of :data:`ROLES`.

        Returns:
            The ``(n_layer, n_head)`` scores.

        Raises:
            ValueError: ``name`` is not a role.

        Shape:
            ``(n_layer, n_head)``.
        """
        if name not in ROLES:
            raise ArgumentError(f"score must be one of {', '.join(ROLES)}, got {name!r}")
        result: torch.Tensor = getattr(self, name)
        return result

    def top(self, name: str, k: int = 5) -> list[tuple[int, str, int, float]]:
        """The ``k`` heads with the highest score, best first.

        Args:
            name: one of :data:`ROLES`.
            k: how many heads. Default 5 (fewer when the model has fewer heads).

        Returns:
            ``(layer index, layer path, head, score)`` tuples; NaN scores last.
        """
        s = self.score(name)
        _check_int("k", k, 1)
        flat = torch.nan_to_num(s.flatten(), nan=-1.0)
        order = torch.argsort(flat, descending=True, stable=True)[:k]
        heads = s.shape[1]
        return [
            (int(i) // heads, self.layers[int(i) // heads], int(i) % heads, float(s.flatten()[i]))
            for i in order
        ]

    def to_dict(self) -> dict[str, Any]:
        """The scores and the input as plain JSON types (lists of floats, ``null`` for NaN).

        Returns:
            ``{"layers", "seq_len", "batch", "bos", "convention", "token_range", "seed",
            "top_k", "copying_chance", "scores": {role: [[…] per layer]}, "top": {role:
            [{layer, head, score}]}}``; ``convention`` is :attr:`convention`.
        """

        def plain(t: torch.Tensor) -> list[list[float | None]]:
            return [[None if v != v else float(v) for v in row] for row in t.tolist()]

        distinct = int(torch.unique(self._repeated()).numel())
        return {
            "layers": list(self.layers),
            "seq_len": self.seq_len,
            "batch": int(self.tokens.shape[0]),
            "bos": self.bos,
            "convention": self.convention,
            "token_range": list(self.token_range),
            "seed": self.seed,
            "top_k": self.top_k,
            "copying_chance": min(1.0, self.top_k / max(distinct, 1)),
            "scores": {name: plain(self.score(name)) for name in ROLES},
            "top": {
                name: [
                    {"layer": li, "name": path, "head": h, "score": None if v != v else v}
                    for li, path, h, v in self.top(name, 5)
                ]
                for name in ROLES
            },
        }

    @classmethod
    def from_dict(cls, data: object) -> HeadRoles:
        """The scores :meth:`to_dict` wrote (``attnlab inspect MODEL --roles --json``), checked:
        the inverse of :meth:`to_dict` (the input tokens are drawn again from its seed).

        Args:
            data: the JSON object (extra keys, such as ``"model"`` or ``"top"``, are ignored).

        Returns:
            The :class:`HeadRoles`; ``HeadRoles.from_dict(r.to_dict()).to_dict() == r.to_dict()``.

        Raises:
            ArgumentTypeError: ``data`` or one of its fields has the wrong type.
            ArgumentError: a field is missing or out of range, or the score matrices do not
                have one row per layer and one column per head alike.

        Shape:
            each score of the result ``(n_layer, n_head)``.
        """
        return _roles_from_dict(data)

    def _repeated(self) -> torch.Tensor:
        """The tokens of ``r + r`` (the input without its ``bos``)."""
        return self.tokens if self.bos is None else self.tokens[:, 1:]


@torch.no_grad()
def head_roles(
    model: GPT,
    *,
    seq_len: int = 50,
    batch: int = 8,
    seed: int = 0,
    token_range: tuple[int, int] | None = None,
    bos: int | None = None,
    top_k: int = 5,
) -> HeadRoles:
    """Previous-token, duplicate-token, induction and copying scores of every head.

    Runs the model (in eval mode; its mode is restored) on :func:`repeated_tokens`, captures
    every layer's exact attention weights (stopping after the last attention layer: no logits
    are computed), and scores them with :func:`role_scores`; the OV circuits are scored on the
    tokens of ``r`` by :func:`copying_scores`. The equations are in the module docstring.

    Args:
        model: an :class:`attnlab.GPT` of any family (GPT-2, Llama/Mistral/Qwen2 with grouped
            query heads, NeoX) and any backend: the weights are the exact softmax weights.
        seq_len: ``n``, the random tokens per copy. Default 50 (the input is ``2n`` long, plus
            ``bos``).
        batch: random sequences averaged over. Default 8.
        seed: the seed of the token generator. Default 0.
        token_range: ``(lo, hi)``, the ids ``r`` is drawn from; default the whole vocabulary.
            Pass one that avoids special tokens (:func:`ordinary_token_range`).
        bos: an id put before each sequence, ``0 <= bos < vocab_size`` (``None``, default:
            none — the scores of ``r + r``). TransformerLens prepends the tokenizer's BOS by
            default: pass ``bos=tokenizer.bos_id`` to measure as it does.
        top_k: the ``k`` of the copying score. Default 5.

    Returns:
        A :class:`HeadRoles`.

    Raises:
        ValueError: the input (``2 · seq_len``, plus ``bos``) is longer than ``n_positions``,
            ``token_range`` is out of the vocabulary or narrower than ``seq_len``, ``bos`` is
            out of the vocabulary, a count is below 1 or ``batch`` above :data:`MAX_BATCH`, or
            the weights of every layer would not fit the memory of the model's device.
        TypeError: ``model`` is not an ``attnlab.GPT``, or an argument has the wrong type.

    Shape:
        each score of the result ``(n_layer, n_head)``.
    """
    if not isinstance(model, GPT):
        raise ArgumentTypeError(
            f"model must be an attnlab.GPT (a decoder-only language model), got "
            f"{type(model).__name__}"
        )
    cfg = model.config
    n = _check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    if bos is not None:  # an id of the vocabulary, checked before anything uses it
        _check_int("bos", bos, 0, cfg.vocab_size - 1)
    length = 2 * n + (bos is not None)
    if length > cfg.n_positions:
        raise ArgumentError(
            f"seq_len {n} makes inputs of {length} tokens (2 · seq_len"
            f"{' + bos' if bos is not None else ''}), longer than the model's n_positions = "
            f"{cfg.n_positions}; use seq_len <= {(cfg.n_positions - (bos is not None)) // 2}"
        )
    allowed = (0, cfg.vocab_size) if token_range is None else token_range
    lo, hi = _check_range(allowed, cfg.vocab_size, n)
    _check_int("top_k", top_k, 1)
    _check_int("batch", batch, 1, MAX_BATCH)
    device = model.transformer.wte.weight.device
    # every attention layer's weights are held at once: (batch, H, T, T) each
    held = cfg.n_layer * batch * cfg.n_head * length**2 * model.transformer.wte.weight.itemsize
    what = "every layer's attention weights of the role scores"
    check_fits(f"batch={batch}, seq_len={n}", held, what=what, device=device)
    tokens = repeated_tokens(n, batch=batch, token_range=(lo, hi), bos=bos, seed=seed)
    was_training = model.training
    model.eval()
    try:
        cache = capture_attention(model, lambda: model(tokens.to(device)))
        layers = cache.names("self")
        per_layer = [role_scores(cache.attentions[name], tokens) for name in layers]
        copying = copying_scores(model, tokens if bos is None else tokens[:, 1:], top_k=top_k)
    finally:
        model.train(was_training)
    return HeadRoles(
        previous=torch.stack([s["previous"] for s in per_layer]).cpu(),
        duplicate=torch.stack([s["duplicate"] for s in per_layer]).cpu(),
        induction=torch.stack([s["induction"] for s in per_layer]).cpu(),
        copying=copying,
        layers=layers,
        tokens=tokens,
        seq_len=n,
        bos=bos,
        token_range=(lo, hi),
        seed=seed,
        top_k=top_k,
    )


#: the most tokens (batch × input length) :meth:`HeadRoles.from_dict` draws again
MAX_TOKENS = 2**22

#: the largest file :func:`load_head_roles` reads (100 layers × 100 heads write ~2 MB)
MAX_ROLES_FILE = 64 * 2**20


def load_head_roles(path: str | os.PathLike[str]) -> tuple[HeadRoles, str | None]:
    """The role scores a JSON file holds (what ``attnlab inspect MODEL --roles --json`` writes:
    :meth:`HeadRoles.to_dict` and ``"model"``), checked by :meth:`HeadRoles.from_dict`.

    Args:
        path: the ``.json`` file.

    Returns:
        The scores, and the model the file names (``None`` when it names none).

    Raises:
        FileNotFoundError: no such file.
        ArgumentError: a file over :data:`MAX_ROLES_FILE` bytes, not JSON, or JSON that is not
            role scores (the message names the file and the field).

    Shape:
        each score of the result ``(n_layer, n_head)``.
    """
    import json

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"role scores file {file} does not exist")
    size = file.stat().st_size
    if size > MAX_ROLES_FILE:
        raise ArgumentError(
            f"{file}: {size} bytes, over the {MAX_ROLES_FILE} a role-score file can take"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ArgumentError(f"{file}: not a JSON file ({reason[:120]})") from None
    try:
        roles = HeadRoles.from_dict(data)
    except (ArgumentError, ArgumentTypeError) as exc:
        raise type(exc)(
            f"{file}: not the output of attnlab inspect MODEL --roles --json: {exc}"
        ) from None
    model = data.get("model") if isinstance(data, dict) else None
    return roles, model if isinstance(model, str) else None


def _roles_from_dict(data: object) -> HeadRoles:
    """:meth:`HeadRoles.from_dict`."""
    if not isinstance(data, dict):
        raise ArgumentTypeError(f"role scores must be a JSON object, got {type(data).__name__}")
    missing = [k for k in ("layers", "seq_len", "batch", "token_range", "seed", "scores")
               if k not in data]  # fmt: skip
    if missing:
        raise ArgumentError(f"role scores lack {', '.join(repr(k) for k in missing)}")
    layers = data["layers"]
    if not isinstance(layers, list) or not layers or not all(isinstance(n, str) for n in layers):
        raise ArgumentTypeError(f"'layers' must be a non-empty list of strings, got {layers!r:.80}")
    n = _check_int("seq_len", data["seq_len"], 1, MAX_SEQ_LEN)
    batch = _check_int("batch", data["batch"], 1)
    bos = data.get("bos")
    if bos is not None:
        _check_int("bos", bos, 0)
    if batch * (2 * n + (bos is not None)) > MAX_TOKENS:
        raise ArgumentError(
            f"batch {batch} × {2 * n + (bos is not None)} tokens is over {MAX_TOKENS} tokens"
        )
    lo, hi = _check_range(data["token_range"], 2**62, n)
    seed = _check_int("seed", data["seed"], 0, 2**63 - 1)
    top_k = _check_int("top_k", data.get("top_k", 5), 1)
    scores = data["scores"]
    if not isinstance(scores, dict) or sorted(scores) != sorted(ROLES):
        got = sorted(scores) if isinstance(scores, dict) else type(scores).__name__
        raise ArgumentError(f"'scores' must map each of {', '.join(ROLES)} to a matrix, got {got}")
    matrices = {name: _score_matrix(name, scores[name], len(layers)) for name in ROLES}
    shapes = {tuple(m.shape) for m in matrices.values()}
    if len(shapes) != 1:
        raise ArgumentError(f"the score matrices differ in shape: {sorted(shapes)}")
    tokens = repeated_tokens(n, batch=batch, token_range=(lo, hi), bos=bos, seed=seed)
    return HeadRoles(
        **matrices, layers=list(layers), tokens=tokens, seq_len=n, bos=bos, token_range=(lo, hi),
        seed=seed, top_k=top_k,
    )  # fmt: skip


def _score_matrix(name: str, rows: object, n_layer: int) -> torch.Tensor:
    """One score's ``(n_layer, n_head)`` float64 matrix from lists of numbers (``null``: NaN)."""
    where = f"scores[{name!r}]"
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise ArgumentTypeError(f"{where} must be a list of rows (lists), got {rows!r:.80}")
    if len(rows) != n_layer or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        lengths = sorted({len(r) for r in rows})
        raise ArgumentError(
            f"{where} must have one row per layer ({n_layer}) of equal, non-zero length, got "
            f"{len(rows)} rows of length {', '.join(map(str, lengths)) or '-'}"
        )
    for r in rows:
        for v in r:
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ArgumentTypeError(f"{where} must hold numbers or null, got {v!r:.40}")
            if v is not None and not math.isfinite(v):
                raise ArgumentError(f"{where} must hold finite numbers or null, got {v!r}")
    values = [[float("nan") if v is None else float(v) for v in r] for r in rows]
    return torch.tensor(values, dtype=torch.float64)
