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
- **agreement with exact per-token patching**: Kendall's τ between the scores and each token's
  patching effect, given a *corrupted* prompt of the same length (other names, another country)
  and a metric ``m = logit[good] − logit[bad]``: ``m(x) − m(x with token j's layer-0 residual
  replaced by the corrupted prompt's)`` (:func:`patching_importance`, through
  :func:`attnlab.inspect.patch_residual`). Leave-one-out asks what the prediction loses without
  token ``j``; patching asks how much of the *difference between the two prompts* token ``j``
  carries — zero at every position where the two prompts hold the same token;
- a **random** explanation's row beside every method's, the floor any method should clear.

:func:`faithfulness_over_prompts` averages every measure over a set of prompts (mean ± standard
deviation), e.g. the packaged :mod:`attnlab.data.prompt_sets`; its :meth:`PromptSetFaithfulness.table`
is what ``attnlab inspect MODEL --faithfulness --prompt-set NAME`` prints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = [
    "BINS",
    "MEASURES",
    "Faithfulness",
    "FaithfulnessSummary",
    "PromptSetFaithfulness",
    "faithfulness",
    "faithfulness_over_prompts",
    "faithfulness_table",
    "leave_one_out",
    "patching_importance",
]

#: ERASER's bins: the share of the tokens removed (comprehensiveness) or kept (sufficiency)
BINS: tuple[float, ...] = (0.01, 0.05, 0.10, 0.20, 0.50)
#: the most prompts one forward of the measures runs
_CHUNK = 64


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
        patching_tau: Kendall's τ with :func:`patching_importance` (NaN without a corrupted
            prompt).

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
    patching_tau: float = math.nan


def _probabilities(model: nn.Module, ids: torch.Tensor, position: int, target: int) -> torch.Tensor:
    """``p(ŷ)`` at ``position`` for each row of ``ids``, in float64, :data:`_CHUNK` rows a
    forward (each row's ``T × vocab`` logits)."""
    with torch.no_grad():
        logits = torch.cat([model(c).logits[:, position] for c in ids.split(_CHUNK)])  # (N, V)
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
    patching: torch.Tensor | None = None,
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
        patching: :func:`patching_importance`, to score the agreement with it (else NaN).

    Returns:
        A :class:`Faithfulness`.

    Raises:
        ValueError: scores of another length, or not finite.

    Shape:
        input_ids ``(T,)`` or ``(1, T)``; scores, loo, patching ``(T,)``.
    """

    ids = _check(model, input_ids, blank_id)
    _check_scores(scores, ids.shape[1])
    with torch.no_grad():
        target = int(model(ids).logits[0, position].argmax())
    ns = list(range(ids.shape[1] + 1))
    rows = _rows(ids, scores, blank_id, ns)
    p = _probabilities(model, rows, position, target)
    loo = leave_one_out(model, ids, blank_id=blank_id, position=position) if loo is None else loo
    return _measures(method, scores, ns, p, loo, patching)


def _check_scores(scores: object, t: int) -> None:
    if not isinstance(scores, torch.Tensor) or scores.shape != (t,):
        raise ArgumentError(
            f"scores must be one score per token, shape ({t},), got "
            f"{tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__}"
        )
    if not bool(torch.isfinite(scores).all()):
        raise ArgumentError("scores must be finite, got NaN or inf")


def _rows(ids: torch.Tensor, scores: torch.Tensor, blank_id: int, ns: list[int]) -> torch.Tensor:
    """The prompt with its top ``n`` tokens deleted, then with only them kept, for each ``n``
    of ``ns`` (the tokens by decreasing score, ties by position: deterministic), ``(2N, T)``."""
    t = ids.shape[1]
    order = sorted(range(t), key=lambda j: (-float(scores[j]), j))
    rank = torch.empty(t, dtype=torch.long, device=ids.device)
    rank[torch.tensor(order, device=ids.device)] = torch.arange(t, device=ids.device)
    top = rank[None, :] < torch.tensor(ns, device=ids.device)[:, None]  # row n: the top n
    return torch.cat([torch.where(top, blank_id, ids), torch.where(top, ids, blank_id)])


def _measures(
    method: str,
    scores: torch.Tensor,
    ns: list[int],
    p: torch.Tensor,
    loo: torch.Tensor,
    patching: torch.Tensor | None,
) -> Faithfulness:
    """The measures of one explanation from ``p`` of its :func:`_rows` (NaN on the curves
    where ``ns`` has no row)."""
    from scipy import stats

    t = scores.shape[0]
    deletion = torch.full((t + 1,), math.nan, dtype=torch.float64)
    insertion = deletion.clone()
    deletion[ns], insertion[ns] = p[: len(ns)].cpu(), p[len(ns) :].cpu()
    full = deletion[0]
    counts = [max(1, math.ceil(k * t)) for k in BINS]
    # AOPC: comprehensiveness = mean_k p(x) − p(x \ r_k); sufficiency = mean_k p(x) − p(r_k)
    comprehensiveness = float(sum(full - deletion[n] for n in counts) / len(counts))
    sufficiency = float(sum(full - insertion[n] for n in counts) / len(counts))
    x = scores.double().cpu().numpy()
    tau = float(stats.kendalltau(x, loo.double().cpu().numpy()).statistic)
    rho = float(stats.spearmanr(x, loo.double().cpu().numpy()).statistic)
    patch_tau = math.nan
    if patching is not None:
        patch_tau = float(stats.kendalltau(x, patching.double().cpu().numpy()).statistic)
    return Faithfulness(
        method, comprehensiveness, sufficiency, tau, rho, deletion, insertion, patch_tau
    )


def patching_importance(
    model: nn.Module,
    input_ids: torch.Tensor,
    corrupted_ids: torch.Tensor,
    *,
    good: int,
    bad: int,
    position: int = -1,
) -> torch.Tensor:
    """Each token's share of the difference between a prompt and a corrupted one, by exact
    per-token patching at layer 0 (:func:`attnlab.inspect.patch_residual`):

        e_j = m(x) − m(x with h_0[j] ← h_0^corrupted[j]),    m = logit[good] − logit[bad]

    ``h_0`` is the residual stream entering layer 0 (the token's embedding), so ``e_j`` is what
    the metric loses when token ``j`` alone is the corrupted prompt's; exactly 0 where the two
    prompts hold the same token. Leave-one-out (:func:`leave_one_out`) is the same patch with a
    blank token in place of the corrupted one, and the probability of the prediction as metric.

    Args:
        model: an :class:`attnlab.GPT`.
        input_ids: the prompt.
        corrupted_ids: the corrupted prompt, as many tokens long.
        good: the answer's token id (``" Mary"``).
        bad: the foil's token id (``" John"``).
        position: the position the metric reads (default the last).

    Returns:
        ``e_j`` for every token, float64.

    Raises:
        ValueError: prompts of different lengths, a token id outside the vocabulary.

    Shape:
        input_ids, corrupted_ids ``(T,)`` or ``(1, T)`` → ``(T,)``.
    """
    from attnlab.inspect.patching import logit_difference, patch_residual

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logit_difference(logits, good, bad, position)

    # the corrupted prompt's layer-0 stream patched into the prompt's run, one position a row
    result = patch_residual(model, corrupted_ids, input_ids, metric, layers=[0])
    return result.corrupted - result.patched[0]


def faithfulness_table(
    model: nn.Module,
    input_ids: torch.Tensor,
    methods: Sequence[str],
    *,
    blank_id: int,
    position: int = -1,
    random_draws: int = 5,
    seed: int = 0,
    corrupted_ids: torch.Tensor | None = None,
    good: int | None = None,
    bad: int | None = None,
    curves: bool = True,
    steps: int = 32,
) -> list[Faithfulness]:
    """:func:`faithfulness` of each :func:`~attnlab.inspect.mixing` method's explanation of the
    prediction at ``position`` (its rolled-out row where the method rolls out, else the last
    layer's), and of a random explanation (the mean of ``random_draws`` draws).

    Every explanation's deleted and kept prompts go through the model together, each distinct
    prompt once (methods often agree on their top tokens). With ``curves=False`` only the
    prompts the measures read are run (the :data:`BINS`' counts: about 8 a method instead of
    ``2 (T + 1)``), and the curves hold NaN elsewhere.

    Args:
        model: a language model.
        input_ids: one prompt.
        methods: :data:`attnlab.inspect.mixing.METHODS` to compare.
        blank_id: the token that replaces a removed one.
        position: the position whose prediction is explained (default the last).
        random_draws: random explanations averaged for the ``"random"`` row.
        seed: the random explanations' seed.
        corrupted_ids: a corrupted prompt of the same length, for the agreement with exact
            per-token patching (:func:`patching_importance`, with ``good`` and ``bad``); without
            it ``patching_tau`` is NaN.
        good: the answer's token id (the patching metric's ``logit[good] − logit[bad]``).
        bad: the foil's token id.
        curves: compute the whole deletion and insertion curves (default ``True``).
        steps: ``integrated_gradients``' interpolation steps.

    Returns:
        One :class:`Faithfulness` per method, then ``"random"``.

    Raises:
        ValueError: ``corrupted_ids`` without ``good`` and ``bad``; see
            :func:`~attnlab.inspect.mixing` for the methods' own.

    Shape:
        input_ids, corrupted_ids ``(T,)`` or ``(1, T)``.
    """
    from attnlab.inspect.capture import attention_modules
    from attnlab.inspect.mixing import mixing

    ids = _check(model, input_ids, blank_id)
    check_positive_int("random_draws", random_draws)
    t = ids.shape[1]
    with torch.no_grad():
        target = int(model(ids).logits[0, position].argmax())
    loo = leave_one_out(model, ids, blank_id=blank_id, position=position)
    patching = None
    if corrupted_ids is not None:
        if good is None or bad is None:
            raise ArgumentError("corrupted_ids needs good and bad, the patching metric's tokens")
        patching = patching_importance(model, ids, corrupted_ids, good=good, bad=bad,
                                       position=position)  # fmt: skip
    explanations = []
    last = list(attention_modules(model))[-1]
    for method in methods:
        # only the explained row is computed (one backward pass, or `steps` forwards, for the
        # gradient methods; one block of rows for the per-layer ones)
        options: dict[str, Any] = {"rows": [position]}
        if method == "integrated_gradients":
            options["steps"] = steps
        elif method == "value_zeroing":  # the last layer's row is the one read
            options["layers"] = last
        mix = mixing(model, ids, method, **options)
        matrix = mix.total if mix.total is not None else mix.per_layer[-1]  # type: ignore[index]
        explanations.append((method, matrix[0, 0].detach().double().cpu()))
    generator = torch.Generator().manual_seed(seed)
    for _ in range(random_draws):
        explanations.append(("random", torch.rand(t, generator=generator, dtype=torch.float64)))
    for _, scores in explanations:
        _check_scores(scores, t)
    ns = list(range(t + 1)) if curves else sorted({0, t, *_counts(t)})
    rows = torch.cat([_rows(ids, scores, blank_id, ns) for _, scores in explanations])
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    p = _probabilities(model, distinct, position, target)[inverse].view(len(explanations), -1)
    measured = [
        _measures(method, scores, ns, p_e, loo, patching)
        for (method, scores), p_e in zip(explanations, p)
    ]
    draws = measured[len(methods) :]
    return [*measured[: len(methods)], _mean("random", draws)]


def _counts(t: int) -> list[int]:
    """The tokens removed or kept for each of :data:`BINS`: ``max(1, ⌈k T⌉)``."""
    return [max(1, math.ceil(k * t)) for k in BINS]


def _mean(method: str, rows: Sequence[Faithfulness]) -> Faithfulness:
    """The mean of several draws' measures and curves."""
    n = len(rows)
    return Faithfulness(
        method,
        sum(d.comprehensiveness for d in rows) / n,
        sum(d.sufficiency for d in rows) / n,
        sum(d.kendall_tau for d in rows) / n,
        sum(d.spearman for d in rows) / n,
        torch.stack([d.deletion for d in rows]).mean(0),
        torch.stack([d.insertion for d in rows]).mean(0),
        sum(d.patching_tau for d in rows) / n,
    )


# --------------------------------------------------------------------- over a set of prompts

#: the measures :func:`faithfulness_over_prompts` averages, as :class:`Faithfulness` names them
MEASURES: tuple[str, ...] = (
    "comprehensiveness",
    "sufficiency",
    "kendall_tau",
    "spearman",
    "patching_tau",
)
#: their column headings (↑: higher is more faithful, ↓: lower)
_HEADINGS = ("AOPC comp. ↑", "AOPC suff. ↓", "τ-LOO ↑", "ρ-LOO ↑", "τ-patch ↑")


@dataclass(frozen=True)
class FaithfulnessSummary:
    """One method's measures over a set of prompts (:func:`faithfulness_over_prompts`).

    Attributes:
        method: the method (``"random"`` for the random baseline).
        mean: each of :data:`MEASURES`' mean over the prompts where it is defined (NaN where
            it is nowhere: ``patching_tau`` without corrupted prompts).
        std: their sample standard deviations (0 for one prompt).
        per_prompt: each measure on every prompt, in order.
    """

    method: str
    mean: dict[str, float]
    std: dict[str, float]
    per_prompt: dict[str, list[float]]


@dataclass(frozen=True)
class PromptSetFaithfulness:
    """Every method's faithfulness over a set of prompts (:func:`faithfulness_over_prompts`).

    Attributes:
        rows: one :class:`FaithfulnessSummary` per method, then ``"random"``.
        prompts: the prompts' texts.
        tokens: each prompt's length in tokens.
        predictions: the token each prompt's explained prediction is (decoded when the caller
            gave a decoder, else its id as text).
        answered: how many prompts the model answers as expected (its prediction is the first
            token of the prompt's answer), of ``with_answer`` prompts that have one.
        with_answer: the prompts with an expected answer.
        blank_id: the token that replaced removed ones.
    """

    rows: list[FaithfulnessSummary]
    prompts: list[str]
    tokens: list[int]
    predictions: list[str]
    answered: int
    with_answer: int
    blank_id: int

    def to_dict(self) -> dict[str, Any]:
        """The results as JSON-ready values.

        Returns:
            The prompts, their lengths and predictions, and each method's mean, standard
            deviation and per-prompt values of every measure (NaN as ``None``).
        """

        def number(v: float) -> float | None:
            return None if math.isnan(v) else v

        return {
            "blank_id": self.blank_id,
            "bins": list(BINS),
            "prompts": self.prompts,
            "tokens": self.tokens,
            "predictions": self.predictions,
            "answered": self.answered,
            "with_answer": self.with_answer,
            "methods": [
                {
                    "method": r.method,
                    **{f"{k}_mean": number(r.mean[k]) for k in MEASURES},
                    **{f"{k}_std": number(r.std[k]) for k in MEASURES},
                    "per_prompt": {k: [number(v) for v in r.per_prompt[k]] for k in MEASURES},
                }
                for r in self.rows
            ],
        }

    def table(self) -> str:
        """The methods × measures table, ``mean ± std`` over the prompts.

        Returns:
            Plain text, a note on the prompts then one method a line (what ``attnlab inspect
            MODEL --faithfulness --prompts …`` prints).
        """
        width = max(len(r.method) for r in self.rows)
        cells = [
            [
                "—" if math.isnan(r.mean[k]) else f"{r.mean[k]:+.3f} ± {r.std[k]:.3f}"
                for k in MEASURES
            ]
            for r in self.rows
        ]
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(_HEADINGS)]
        lines = [
            "  ".join([" " * width, *(h.rjust(w) for h, w in zip(_HEADINGS, widths))]),
        ]
        for r, c in zip(self.rows, cells):
            lines.append(
                "  ".join([r.method.ljust(width), *(v.rjust(w) for v, w in zip(c, widths))])
            )
        lengths = (
            f"{min(self.tokens)}–{max(self.tokens)}"
            if len(set(self.tokens)) > 1
            else str(self.tokens[0])
        )
        note = (
            f"{len(self.prompts)} prompts of {lengths} tokens, mean ± std; blank token "
            f"{self.blank_id}"
        )
        if self.with_answer:
            note += (
                f"; the model predicts the expected answer on {self.answered}/{self.with_answer}"
            )
        return "\n".join([note, *lines])


def faithfulness_over_prompts(
    model: nn.Module,
    prompts: Sequence[Any],
    encode: Callable[[str], Sequence[int]],
    methods: Sequence[str],
    *,
    blank_id: int,
    decode: Callable[[list[int]], str] | None = None,
    random_draws: int = 5,
    seed: int = 0,
    steps: int = 32,
) -> PromptSetFaithfulness:
    """:func:`faithfulness_table` of the next token of each prompt, averaged over the prompts.

    Each prompt is explained at its last position (the model's own prediction there). A prompt
    with a ``corrupted`` text, an ``answer`` and a ``foil`` also scores the agreement with exact
    per-token patching (:func:`patching_importance`, metric ``logit[answer] − logit[foil]``,
    their first tokens).

    Args:
        model: a language model.
        prompts: :class:`attnlab.data.prompt_sets.Prompt` (or plain strings).
        encode: text → token ids, as the model reads them (no special tokens).
        methods: :data:`attnlab.inspect.mixing.METHODS` to compare.
        blank_id: the token that replaces a removed one.
        decode: token ids → text, to name each prediction (default: the id).
        random_draws: random explanations averaged, per prompt, for the ``"random"`` row.
        seed: the random explanations' seed (prompt ``i`` draws from ``seed + i``).
        steps: ``integrated_gradients``' interpolation steps.

    Returns:
        A :class:`PromptSetFaithfulness`.

    Raises:
        ValueError: no prompt, a prompt that encodes to no token, a corrupted prompt of another
            length than its prompt, a corrupted prompt without an answer and a foil.
    """
    from attnlab.data.prompt_sets import Prompt

    items = [Prompt(p) if isinstance(p, str) else p for p in prompts]
    if not items:
        raise ArgumentError("prompts must hold at least one prompt, got none")
    device = next(model.parameters()).device
    encoded = []  # every prompt checked before any is measured
    for i, item in enumerate(items):
        ids = torch.tensor([list(encode(item.prompt))], dtype=torch.long, device=device)
        if ids.shape[1] == 0:
            raise ArgumentError(f"prompt {i} ({item.prompt!r}) encodes to no token")
        options: dict[str, Any] = {}
        good = encode(item.answer)[0] if item.answer else None
        if item.corrupted is not None:
            corrupted = torch.tensor([list(encode(item.corrupted))], device=device)
            if corrupted.shape != ids.shape:
                raise ArgumentError(
                    f"prompt {i}: the corrupted prompt must have as many tokens as the prompt "
                    f"({ids.shape[1]}), got {corrupted.shape[1]} ({item.corrupted!r})"
                )
            if good is None or not item.foil:
                raise ArgumentError(f"prompt {i}: a corrupted prompt needs an answer and a foil")
            options = {"corrupted_ids": corrupted, "good": good, "bad": encode(item.foil)[0]}
        encoded.append((ids, good, options))
    tables, tokens, predictions = [], [], []
    answered = with_answer = 0
    for i, (ids, good, options) in enumerate(encoded):
        with torch.no_grad():
            predicted = int(model(ids).logits[0, -1].argmax())
        if good is not None:
            with_answer += 1
            answered += predicted == good
        predictions.append(decode([predicted]) if decode is not None else str(predicted))
        tables.append(
            faithfulness_table(model, ids, methods, blank_id=blank_id, random_draws=random_draws,
                               seed=seed + i, curves=False, steps=steps, **options)
        )  # fmt: skip
        tokens.append(ids.shape[1])
    rows = []
    for m, method in enumerate([*methods, "random"]):
        per_prompt = {k: [float(getattr(t[m], k)) for t in tables] for k in MEASURES}
        mean, std = {}, {}
        for k, values in per_prompt.items():
            kept = torch.tensor([v for v in values if not math.isnan(v)], dtype=torch.float64)
            mean[k] = float(kept.mean()) if len(kept) else math.nan
            std[k] = float(kept.std()) if len(kept) > 1 else (0.0 if len(kept) else math.nan)
        rows.append(FaithfulnessSummary(method, mean, std, per_prompt))
    return PromptSetFaithfulness(
        rows, [p.prompt for p in items], tokens, predictions, answered, with_answer, blank_id
    )
