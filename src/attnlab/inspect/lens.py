"""What each layer would predict: the logit lens, and a lens's distance to the model's output.

The residual stream after block ``l`` of a pre-norm decoder, ``h_l``, is read through the
model's own final norm and unembedding (nostalgebraist 2020, "interpreting GPT: the logit lens"),

    lens_l = W_U · Norm_f(h_l) (+ b_U),        l = 0 (the embeddings), 1, …, L,

so that the last row, ``l = L``, *is* the model's output: ``logits = W_U · Norm_f(h_L)``. Nothing
is recomputed by hand: the states are what the model's hook points saw (``hook_resid_pre`` of the
first block, ``hook_resid_post`` of every block), and the norm and the unembedding are the
model's own modules (``transformer.ln_f`` and ``lm_head`` of a :class:`~attnlab.GPT`, LayerNorm
or RMSNorm, tied or not), applied to each recorded ``(B, T, d_model)`` state exactly as the
model applied them to the last one — so the last row equals the model's logits bit for bit.

A *tuned* lens (Belrose et al. 2023, :mod:`attnlab.inspect.tuned_lens`) first maps ``h_l`` by a
learned affine translator ``h ↦ h + A_l h + b_l``; every function here takes it as ``tuned=``.

The encoder-decoder (:class:`~attnlab.Transformer`) is read on its decoder side: the target
embeddings and each decoder layer's output, through the decoder's final norm (a LayerNorm when
pre-norm; with the paper's post-norm layers it is the identity, each layer already ending in its
own LayerNorm, so the lens is the output projection alone) and ``lm_head``. Its last row is the
decoder's logits, as for a GPT.

:func:`lens_comparison` measures, per layer, the KL divergence from the final distribution,
``KL(p_L ‖ p_l) = Σ_v p_L(v) (log p_L(v) − log p_l(v))``, and the cross-entropy of the lens
against the actual next token, both in bits per token (Belrose et al.'s Figure 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from attnlab._budget import check_fits
from attnlab._checks import check_positive_int, check_tensor, shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.patching import _evaluating
from attnlab.nn.hooks import hook_points

__all__ = [
    "LensComparison",
    "LensResult",
    "Translator",
    "lens_comparison",
    "lens_stack",
    "logit_lens",
]

LOG2 = math.log(2.0)


class Translator(Protocol):
    """What a tuned lens gives the lens functions: the state ``h`` of row ``row`` translated."""

    def translate(self, h: torch.Tensor, row: int) -> torch.Tensor:
        """``h`` of row ``row`` (0 = the embeddings) mapped before the final norm.

        Args:
            h: the residual stream.
            row: the row (0 = the embeddings, ``l`` = after block ``l − 1``).

        Returns:
            The translated state.

        Shape:
            h ``(..., d_model)`` → ``(..., d_model)``.
        """
        ...  # pragma: no cover


@dataclass(frozen=True)
class LensStack:
    """Where a model's residual stream is read and how it becomes logits.

    Attributes:
        names: the hook points of the rows: the first block's ``hook_resid_pre`` (row 0, the
            embeddings), then every block's ``hook_resid_post``.
        labels: a label per row: ``"embed"``, then ``"0"``, ``"1"``, … (the block that wrote it).
        norm: the model's final norm (an ``nn.Identity`` for a post-norm decoder).
        head: the model's unembedding, ``lm_head``.
        run: runs the model on the inputs and returns its logits.
    """

    names: tuple[str, ...]
    labels: tuple[str, ...]
    norm: nn.Module
    head: nn.Module
    run: Callable[[], torch.Tensor]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``head(norm(h))``: the model's own modules, as its forward applies them.

        Shape:
            h ``(B, T, d_model)`` → ``(B, T, vocab)``.
        """
        return self.head(self.norm(h))  # type: ignore[no-any-return]


def lens_stack(
    model: nn.Module, input_ids: torch.Tensor, target_ids: torch.Tensor | None = None
) -> LensStack:
    """The rows a lens reads of ``model`` and its final norm and unembedding.

    Args:
        model: an :class:`attnlab.GPT` (any family) or an :class:`attnlab.Transformer` (its
            decoder side).
        input_ids: the tokens (a Transformer's source).
        target_ids: a Transformer's decoder input (required there; ``None`` for a GPT).

    Returns:
        :class:`LensStack`.

    Raises:
        TypeError: another kind of model.
        ValueError: ``target_ids`` missing for a Transformer, or given for a GPT.

    Shape:
        input_ids ``(B, T)``; target_ids ``(B, T_tgt)``.
    """
    from attnlab.models.gpt import GPT
    from attnlab.models.transformer import Transformer

    if isinstance(model, GPT):
        if target_ids is not None:
            raise ArgumentError("target_ids is for an encoder-decoder; a GPT reads input_ids only")
        n = len(model.transformer.h)
        prefix, norm = "transformer.h", model.transformer.ln_f

        def run() -> torch.Tensor:
            return model(input_ids).logits  # type: ignore[no-any-return]

    elif isinstance(model, Transformer):
        if target_ids is None:
            raise ArgumentError("target_ids (the decoder's input) is required for a Transformer")
        n = len(model.decoder.layers)
        prefix, norm = "decoder.layers", model.decoder.norm

        def run() -> torch.Tensor:
            return model(input_ids, target_ids).logits  # type: ignore[no-any-return]

    else:
        raise ArgumentTypeError(
            f"model must be an attnlab.GPT (any family) or an attnlab.Transformer, got "
            f"{type(model).__name__}"
        )
    names = (f"{prefix}.0.hook_resid_pre", *(f"{prefix}.{i}.hook_resid_post" for i in range(n)))
    labels = ("embed", *(str(i) for i in range(n)))
    return LensStack(names, labels, norm, model.lm_head, run)


def record_stream(stack: LensStack, model: nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward (eval mode, no gradients): the model's logits and each row's state, as its
    hook point saw it (a copy, same shape and strides).

    Shape:
        logits ``(B, T, vocab)``; each state ``(B, T, d_model)``.
    """
    points = hook_points(model)
    seen: dict[str, torch.Tensor] = {}
    handles = []
    try:
        for name in stack.names:

            def keep(_m: nn.Module, _a: Any, out: torch.Tensor, name: str = name) -> None:
                seen[name] = out.detach().clone()

            handles.append(points[name].register_forward_hook(keep))
        with _evaluating(model), torch.no_grad():
            logits = stack.run()
    finally:
        for handle in handles:
            handle.remove()
    return logits, [seen[n] for n in stack.names]


def _ids(name: str, ids: object, model: nn.Module) -> torch.Tensor:
    x = check_tensor(name, ids)
    if x.dtype == torch.bool or x.is_floating_point() or x.is_complex():
        raise ArgumentTypeError(f"{name} must hold integer token ids, got dtype {x.dtype}")
    if x.dim() == 1:
        x = x[None]
    if x.dim() != 2 or x.numel() == 0:
        raise ArgumentError(
            f"{name} must be (T,) or (B, T) token ids, got shape {shape_str(x.shape)}"
        )
    device = next(model.parameters()).device
    return x.to(device=device, dtype=torch.long)


def _vocab(stack: LensStack) -> int:
    weight = getattr(stack.head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) else 0


@dataclass(frozen=True)
class LensResult:
    """What each layer would predict at each position.

    Attributes:
        lens: ``"logit"`` or ``"tuned"``.
        layers: a label per row: ``"embed"``, then the block that wrote it (``"0"``, ``"1"``, …).
        logits: each row's lens logits; the last row is the model's logits, bit for bit.
        final: the model's own logits.

    Shape:
        logits ``(L + 1, B, T, vocab)`` in the model's dtype; final ``(B, T, vocab)``.
    """

    lens: str
    layers: tuple[str, ...]
    logits: torch.Tensor
    final: torch.Tensor

    def top(self, k: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most probable tokens of every row and position, and their probabilities.

        Args:
            k: how many (default 1).

        Returns:
            ``(probabilities, token ids)``, largest first; probabilities in float64.

        Shape:
            both ``(L + 1, B, T, k)``.
        """
        check_positive_int("k", k)
        p = torch.softmax(self.logits.double(), dim=-1)
        values, ids = p.topk(min(k, p.shape[-1]), dim=-1)
        return values, ids

    def kl_to_final(self) -> torch.Tensor:
        """``KL(p_L ‖ p_l)`` of every row and position, in bits (0 in the last row).

        Returns:
            The divergences.

        Shape:
            ``(L + 1, B, T)``, float64.
        """
        return _kl_bits(self.final.double(), self.logits.double())

    def first_top(self, token: int, position: int = -1, row: int = 0) -> int | None:
        """The first row whose most probable token at ``position`` is ``token``, or ``None``.

        Args:
            token: the token id.
            position: the position read (default the last).
            row: the batch row (default 0).

        Returns:
            The row index (0 = the embeddings, ``l`` = after block ``l − 1``) or ``None``.
        """
        top = self.logits[:, row, position].argmax(dim=-1)
        hits = (top == token).nonzero().flatten().tolist()
        return int(hits[0]) if hits else None

    def to_dict(
        self, decode: Callable[[int], str] | None = None, *, row: int = 0
    ) -> dict[str, Any]:
        """One batch row as JSON-ready values: for every layer and position the top token, its
        probability and its KL to the final distribution (bits).

        Args:
            decode: turns a token id into its text (``None``: ids only).
            row: the batch row (default 0).

        Returns:
            ``{"lens", "layers": [{"layer", "positions": [{"token_id", "token", "prob",
            "kl_bits"}, …]}, …]}``.
        """
        probs, ids = self.top(1)
        kl = self.kl_to_final()
        layers = []
        for i, label in enumerate(self.layers):
            cells = []
            for t in range(self.logits.shape[2]):
                tok = int(ids[i, row, t, 0])
                cell: dict[str, Any] = {"token_id": tok, "prob": float(probs[i, row, t, 0])}
                if decode is not None:
                    cell["token"] = decode(tok)
                cell["kl_bits"] = float(kl[i, row, t])
                cells.append(cell)
            layers.append({"layer": label, "positions": cells})
        return {"lens": self.lens, "layers": layers}


def _kl_bits(final: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(final) ‖ softmax(lens))`` over the last dimension, in bits.

    Shape:
        final ``(..., V)`` broadcast against lens ``(..., V)`` → ``(...)``.
    """
    log_p = torch.log_softmax(final, dim=-1)
    log_q = torch.log_softmax(lens, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1) / LOG2


def lens_logits(
    stack: LensStack, states: list[torch.Tensor], tuned: Translator | None, row: int
) -> torch.Tensor:
    """Row ``row``'s lens logits: ``head(norm(h))``, with ``h`` translated by ``tuned`` first.

    Shape:
        each state ``(B, T, d_model)`` → ``(B, T, vocab)``.
    """
    h = states[row]
    if tuned is not None:
        h = tuned.translate(h, row)
    return stack.logits(h)


def logit_lens(
    model: nn.Module,
    input_ids: torch.Tensor,
    *,
    target_ids: torch.Tensor | None = None,
    tuned: Translator | None = None,
) -> LensResult:
    """Each layer's residual stream read through the model's final norm and unembedding.

    One forward (eval mode, no gradients) records the embeddings and every block's output at
    their hook points; each is then given to the model's own ``ln_f`` and ``lm_head`` (an
    encoder-decoder's ``decoder.norm`` and ``lm_head``), one ``(B, T, d_model)`` tensor at a
    time as the model's forward does, so the last row equals the model's logits bit for bit.
    With ``tuned`` (a :class:`~attnlab.inspect.tuned_lens.TunedLens`), each state is first
    mapped by its layer's translator (the tuned lens).

    Args:
        model: an :class:`attnlab.GPT` (any family) or an :class:`attnlab.Transformer`.
        input_ids: the tokens (a Transformer's source).
        target_ids: a Transformer's decoder input (its rows are the decoder's positions).
        tuned: a tuned lens for ``model``, or ``None`` (the logit lens).

    Returns:
        :class:`LensResult`.

    Raises:
        ValueError: ids of the wrong shape; the lens logits would not fit in memory.
        TypeError: another kind of model; ids that are not integers.

    Shape:
        input_ids ``(T,)`` or ``(B, T)``; logits ``(L + 1, B, T, vocab)``.

    Examples:
        >>> lens = logit_lens(model, ids)
        >>> torch.equal(lens.logits[-1], model(ids[None]).logits)
        True
    """
    ids = _ids("input_ids", input_ids, model)
    tgt = None if target_ids is None else _ids("target_ids", target_ids, model)
    stack = lens_stack(model, ids, tgt)
    rows_shape = (tgt if tgt is not None else ids).shape
    param = next(model.parameters())
    needed = len(stack.names) * rows_shape[0] * rows_shape[1] * _vocab(stack) * param.element_size()
    check_fits("input_ids", 2 * needed, what="every layer's lens logits", device=param.device)
    logits, states = record_stream(stack, model)
    with _evaluating(model), torch.no_grad():
        rows = [lens_logits(stack, states, tuned, i) for i in range(len(states))]
    return LensResult(
        lens="logit" if tuned is None else "tuned",
        layers=stack.labels,
        logits=torch.stack(rows),
        final=logits,
    )


@dataclass(frozen=True)
class LensComparison:
    """Per layer, how far each lens is from the model's output, over a text's tokens.

    Attributes:
        layers: the row labels (``"embed"``, ``"0"``, …).
        kl_logit: the logit lens's mean ``KL(p_L ‖ p_l)``, bits per token.
        kl_tuned: the tuned lens's, or ``None`` without one.
        bits_logit: the logit lens's cross-entropy against the next token, bits per token.
        bits_tuned: the tuned lens's, or ``None``.
        bits_model: the model's own cross-entropy, bits per token.
        tokens: the positions averaged over.

    Shape:
        each per-layer tensor ``(L + 1,)``, float64.
    """

    layers: tuple[str, ...]
    kl_logit: torch.Tensor
    kl_tuned: torch.Tensor | None
    bits_logit: torch.Tensor
    bits_tuned: torch.Tensor | None
    bits_model: float
    tokens: int

    def rows(self) -> list[dict[str, Any]]:
        """The table, one row a layer.

        Returns:
            One dict a layer: ``layer``, ``kl_logit``, ``kl_tuned``, ``bits_logit``,
            ``bits_tuned`` (``None`` without a tuned lens).
        """
        out = []
        for i, label in enumerate(self.layers):
            out.append(
                {
                    "layer": label,
                    "kl_logit": float(self.kl_logit[i]),
                    "kl_tuned": None if self.kl_tuned is None else float(self.kl_tuned[i]),
                    "bits_logit": float(self.bits_logit[i]),
                    "bits_tuned": None if self.bits_tuned is None else float(self.bits_tuned[i]),
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready values.

        Returns:
            ``layers`` (:meth:`rows`), ``bits_model``, ``tokens``.
        """
        return {"layers": self.rows(), "bits_model": self.bits_model, "tokens": self.tokens}


def _next_token_bits(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of position ``t`` against token ``t + 1``, bits, summed over the batch.

    Shape:
        logits ``(B, T, V)``; ids ``(B, T)`` → ``()``.
    """
    logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    return -logp.gather(-1, ids[:, 1:, None]).sum() / LOG2


def lens_comparison(
    model: nn.Module, input_ids: torch.Tensor, tuned: Translator | None = None
) -> LensComparison:
    """Per layer: the KL divergence from the final distribution and the bits per token of the
    logit lens and, with ``tuned``, of the tuned lens, over every position of ``input_ids``.

    ``KL(p_L ‖ p_l)`` is averaged over all positions; the cross-entropy against the next token
    over all positions but the last of each row. One layer's logits exist at a time.

    Args:
        model: an :class:`attnlab.GPT`.
        input_ids: held-out text, one or more rows.
        tuned: a :class:`~attnlab.inspect.tuned_lens.TunedLens` for ``model``, or ``None``.

    Returns:
        :class:`LensComparison`.

    Raises:
        ValueError: rows of fewer than 2 tokens.
        TypeError: not a GPT; ids that are not integers.

    Shape:
        input_ids ``(T,)`` or ``(B, T)``.
    """
    from attnlab.models.gpt import GPT

    if not isinstance(model, GPT):
        raise ArgumentTypeError(f"model must be an attnlab.GPT, got {type(model).__name__}")
    ids = _ids("input_ids", input_ids, model)
    if ids.shape[1] < 2:
        raise ArgumentError(f"input_ids needs at least 2 tokens a row, got {ids.shape[1]}")
    stack = lens_stack(model, ids)
    final, states = record_stream(stack, model)
    f64 = final.double()
    n_kl, n_ce = ids.numel(), ids.shape[0] * (ids.shape[1] - 1)
    lenses = [("logit", None)] + ([("tuned", tuned)] if tuned is not None else [])
    kl = {name: torch.zeros(len(states), dtype=torch.float64) for name, _ in lenses}
    ce = {name: torch.zeros(len(states), dtype=torch.float64) for name, _ in lenses}
    with _evaluating(model), torch.no_grad():
        for name, lens in lenses:
            for i in range(len(states)):
                z = lens_logits(stack, states, lens, i)
                kl[name][i] = float(_kl_bits(f64, z.double()).sum()) / n_kl
                ce[name][i] = float(_next_token_bits(z, ids)) / n_ce
    return LensComparison(
        layers=stack.labels,
        kl_logit=kl["logit"],
        kl_tuned=kl.get("tuned"),
        bits_logit=ce["logit"],
        bits_tuned=ce.get("tuned"),
        bits_model=float(_next_token_bits(final, ids)) / n_ce,
        tokens=n_kl,
    )
