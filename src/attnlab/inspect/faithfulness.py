"""How far an explanation can be trusted: does the model's prediction depend on the tokens it
ranks highest (:func:`faithfulness`, :func:`faithfulness_table`)?

An explanation here is one score per input token for the prediction at one position (e.g. row
``i`` of :func:`attnlab.inspect.mixing`'s rolled-out matrix). Removing a token means replacing
its id by a blank token (``blank_id``: a padding or unknown token), so positions do not move.
With ``p(x)`` the probability the model gives its own prediction ``ŷ`` at the position:

- **deletion / insertion curves**: ``p`` after removing the ``n`` highest-scored tokens, and
  after restoring them into an all-blank input, ``n = 0 … T``;
- **comprehensiveness / sufficiency** (DeYoung et al. 2020, ERASER, §4): with ``r_k`` the top
  ``k`` % of the tokens, ``p(x) − p(x \\ r_k)`` and ``p(x) − p(r_k)``, averaged over
  ``k ∈ {1, 5, 10, 20, 50}`` (AOPC); high comprehensiveness and low sufficiency are faithful;
- **agreement with leave-one-out**: Kendall's τ and Spearman's ρ (scipy) between the scores
  and ``p(x) − p(x \\ {j})``, the exact effect of blanking each token alone — which equals
  patching the blanked token's embedding into the run (:func:`attnlab.inspect.patch_residual`
  at layer 0's input);
- a **random** explanation's row beside every method's, the floor any method should clear.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = ["BINS", "Faithfulness", "faithfulness", "faithfulness_table", "leave_one_out"]

#: ERASER's bins: the share of the tokens removed (comprehensiveness) or kept (sufficiency)
BINS: tuple[float, ...] = (0.01, 0.05, 0.10, 0.20, 0.50)


@dataclass(frozen=True)
class Faithfulness:
    """One explanation's faithfulness (:func:`faithfulness`).

    Attributes:
        method: the explanation's name.
        comprehensiveness: AOPC of ``p(x) − p(x \\ r_k)`` over :data:`BINS` (higher: the top
            tokens matter).
        sufficiency: AOPC of ``p(x) − p(r_k)`` (lower: the top tokens suffice).
        kendall_tau: Kendall's τ with leave-one-out importance.
        spearman: Spearman's ρ with leave-one-out importance.
        deletion: ``p`` after deleting the top ``n`` tokens, ``n = 0 … T``.
        insertion: ``p`` after inserting the top ``n`` tokens into a blank input.

    Shape:
        deletion, insertion ``(T + 1,)``.
    """

    method: str
    comprehensiveness: float
    sufficiency: float
    kendall_tau: float
    spearman: float
    deletion: torch.Tensor
    insertion: torch.Tensor


def _probabilities(model: nn.Module, ids: torch.Tensor, position: int, target: int) -> torch.Tensor:
    """``p(ŷ)`` at ``position`` for each row of ``ids``, in float64."""
    with torch.no_grad():
        logits = model(ids).logits[:, position]  # (N, V)
    return logits.double().softmax(-1)[:, target]


def _check(model: nn.Module, input_ids: object, blank_id: object) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point():
        raise ArgumentTypeError(
            f"input_ids must be an integer tensor (1, T), got {type(input_ids).__name__}"
        )
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ArgumentError(
            f"input_ids must hold one prompt, (T,) or (1, T), got {tuple(input_ids.shape)}"
        )
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(blank_id, bool) or not isinstance(blank_id, int):
        raise ArgumentTypeError(f"blank_id must be an int token id, got {blank_id!r}")
    if not 0 <= blank_id < (vocab if isinstance(vocab, int) else 2**62):
        raise ArgumentError(f"blank_id must be a token id in [0, {vocab}), got {blank_id}")
    return input_ids


def leave_one_out(
    model: nn.Module, input_ids: torch.Tensor, *, blank_id: int, position: int = -1
) -> torch.Tensor:
    """Each token's leave-one-out importance for the prediction at ``position``:
    ``p(ŷ | x) − p(ŷ | x with token j blanked)``, in one batched forward.

    Args:
        model: a language model (``model(ids).logits``).
        input_ids: one prompt.
        blank_id: the token that replaces a removed one.
        position: the position whose prediction is explained (default the last).

    Returns:
        The importance of each token (tokens after ``position`` get 0: they cannot matter).

    Shape:
        input_ids ``(T,)`` or ``(1, T)`` → ``(T,)``.
    """
    ids = _check(model, input_ids, blank_id)
    t = ids.shape[1]
    with torch.no_grad():
        target = int(model(ids).logits[0, position].argmax())
    rows = ids.repeat(t + 1, 1)  # row j blanks token j; the last row is the prompt
    rows[torch.arange(t), torch.arange(t)] = blank_id
    p = _probabilities(model, rows, position, target)
    return p[t] - p[:t]


def faithfulness(
    model: nn.Module,
    input_ids: torch.Tensor,
    scores: torch.Tensor,
    *,
    blank_id: int,
    position: int = -1,
    method: str = "explanation",
    loo: torch.Tensor | None = None,
) -> Faithfulness:
    """How faithful one explanation of the prediction at ``position`` is (see the module
    docstring for each measure).

    Args:
        model: a language model (``model(ids).logits``).
        input_ids: one prompt.
        scores: the explanation, one score per token (higher: more important).
        blank_id: the token that replaces a removed one (a padding or unknown token).
        position: the position whose prediction is explained (default the last).
        method: the explanation's name, kept in the result.
        loo: :func:`leave_one_out`'s importance, when already computed (several methods).

    Returns:
        A :class:`Faithfulness`.

    Raises:
        ValueError: scores of another length, or not finite.

    Shape:
        input_ids ``(T,)`` or ``(1, T)``; scores ``(T,)``.
    """
    from scipy import stats

    ids = _check(model, input_ids, blank_id)
    t = ids.shape[1]
    if not isinstance(scores, torch.Tensor) or scores.shape != (t,):
        raise ArgumentError(
            f"scores must be one score per token, shape ({t},), got "
            f"{tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__}"
        )
    if not bool(torch.isfinite(scores).all()):
        raise ArgumentError("scores must be finite, got NaN or inf")
    with torch.no_grad():
        target = int(model(ids).logits[0, position].argmax())
    # the tokens by decreasing score (ties by position, so the order is deterministic)
    order = sorted(range(t), key=lambda j: (-float(scores[j]), j))
    rank = torch.empty(t, dtype=torch.long)
    rank[torch.tensor(order)] = torch.arange(t)
    top = rank[None, :] < torch.arange(t + 1)[:, None]  # row n: the top n tokens    (T + 1, T)
    deleted = torch.where(top, blank_id, ids)  # the top n removed
    inserted = torch.where(top, ids, blank_id)  # only the top n kept
    p = _probabilities(model, torch.cat([deleted, inserted]), position, target)
    deletion, insertion = p[: t + 1], p[t + 1 :]
    full = deletion[0]
    counts = [max(1, math.ceil(k * t)) for k in BINS]
    comprehensiveness = float(sum(full - deletion[n] for n in counts) / len(counts))
    sufficiency = float(sum(full - insertion[n] for n in counts) / len(counts))
    loo = leave_one_out(model, ids, blank_id=blank_id, position=position) if loo is None else loo
    tau = stats.kendalltau(scores.double().cpu().numpy(), loo.double().cpu().numpy()).statistic
    rho = stats.spearmanr(scores.double().cpu().numpy(), loo.double().cpu().numpy()).statistic
    return Faithfulness(
        method, comprehensiveness, sufficiency, float(tau), float(rho), deletion, insertion
    )


def faithfulness_table(
    model: nn.Module,
    input_ids: torch.Tensor,
    methods: Sequence[str],
    *,
    blank_id: int,
    position: int = -1,
    random_draws: int = 5,
    seed: int = 0,
) -> list[Faithfulness]:
    """:func:`faithfulness` of each :func:`~attnlab.inspect.mixing` method's explanation of the
    prediction at ``position`` (its rolled-out row where the method rolls out, else the last
    layer's), and of a random explanation (the mean of ``random_draws`` draws).

    Args:
        model: a language model.
        input_ids: one prompt.
        methods: :data:`attnlab.inspect.mixing.METHODS` to compare.
        blank_id: the token that replaces a removed one.
        position: the position whose prediction is explained (default the last).
        random_draws: random explanations averaged for the ``"random"`` row.
        seed: the random explanations' seed.

    Returns:
        One :class:`Faithfulness` per method, then ``"random"``.

    Shape:
        input_ids ``(T,)`` or ``(1, T)``.
    """
    from attnlab.inspect.mixing import mixing

    ids = _check(model, input_ids, blank_id)
    t = ids.shape[1]
    loo = leave_one_out(model, ids, blank_id=blank_id, position=position)
    rows = []
    for method in methods:
        mix = mixing(model, ids, method)
        matrix = mix.total if mix.total is not None else mix.per_layer[-1]  # type: ignore[index]
        scores = matrix[0, position].detach().double().cpu()
        rows.append(
            faithfulness(
                model, ids, scores, blank_id=blank_id, position=position, method=method, loo=loo
            )
        )
    generator = torch.Generator().manual_seed(seed)
    draws = [
        faithfulness(
            model,
            ids,
            torch.rand(t, generator=generator, dtype=torch.float64),
            blank_id=blank_id,
            position=position,
            loo=loo,
        )
        for _ in range(random_draws)
    ]
    rows.append(
        Faithfulness(
            "random",
            sum(d.comprehensiveness for d in draws) / len(draws),
            sum(d.sufficiency for d in draws) / len(draws),
            sum(d.kendall_tau for d in draws) / len(draws),
            sum(d.spearman for d in draws) / len(draws),
            torch.stack([d.deletion for d in draws]).mean(0),
            torch.stack([d.insertion for d in draws]).mean(0),
        )
    )
    return rows
