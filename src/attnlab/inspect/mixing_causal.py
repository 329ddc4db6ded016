"""Context-mixing methods that intervene or differentiate (:func:`attnlab.inspect.mixing`).

- ``"value_zeroing"`` (Mohebbi et al. 2023): in layer ``l``, with its input fixed, zero token
  ``j``'s value vectors (every head) and measure how far each output ``y_i`` of the block moves,
  ``c_ij = 1 − cos(ỹ_i^{¬j}, y_i)``, rows normalised to sum to 1. One forward per layer, the
  input repeated ``T + 1`` times (row ``j`` zeroes token ``j``, the last row zeroes nothing),
  stopped after the layer's block.
- ``"grad_weights"`` (Chefer et al. 2021, eq. 13–14): for output position ``i``'s target logit,
  ``Ā_l = E_h[(∇A_l ⊙ A_l)^+]`` and ``R ← R + Ā_l R`` from ``R = I``; row ``i`` of ``R`` is
  position ``i``'s relevance. ``∇A`` is read as ``(∂L/∂z) vᵀ``: the layer computed
  ``z = A v``, so this is the gradient with respect to the weights it used, whatever kernel ran.
- ``"integrated_gradients"`` (Sundararajan et al. 2017, through Captum): for output position
  ``i``'s target logit, the token embeddings' attributions along the straight path from a
  baseline, every position holding the embedding of token ``baseline_id`` (default 0), summed
  over the embedding dimension. Not the zero vector: in a model whose first operation is a
  norm (every family without a learned position table: Llama, Mistral, Qwen2, NeoX, ALiBi
  models), the path from zero passes through inputs that the norms scale by up to
  ``1/√ε``, the output changes over many decades of scale next to zero, and no Riemann sum of
  32 (or 512) steps integrates it: completeness, ``Σ_j IG_ij = f_i(x) − f_i(baseline)``,
  failed by more than 100% on a tiny Llama. From a token's embedding it holds to 1e-3.

The target of position ``i`` is the token the model scores highest there (its prediction).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError
from attnlab.inspect.capture import attention_modules

__all__ = ["run"]

#: the longest input the per-position gradient methods accept (one backward per position)
MAX_GRADIENT_LENGTH = 256


class _Stop(Exception):
    """Raised by a hook once the block of interest has run; never leaves this module."""


def run(
    model: nn.Module,
    input_ids: torch.Tensor,
    method: str,
    layers: str | None,
    forward_kwargs: dict[str, Any],
    rows: Any = None,
    *,
    baseline_id: int = 0,
    steps: int = 32,
) -> Any:
    """Run one of this module's methods (:func:`attnlab.inspect.mixing` dispatches here).

    Args:
        model: the language model.
        input_ids: the tokens.
        method: ``"value_zeroing"``, ``"grad_weights"`` or ``"integrated_gradients"``.
        layers: the attention layers to read, by path prefix (as :func:`~attnlab.inspect.mixing`).
        forward_kwargs: further arguments of the model's forward.
        rows: the query positions to return (``rows=`` of :func:`~attnlab.inspect.mixing`):
            value zeroing cuts its result to them, the gradient methods run one backward pass
            per position asked for only.
        baseline_id: ``integrated_gradients``' baseline token (see the module docstring).
        steps: ``integrated_gradients``' interpolation steps.

    Returns:
        A :class:`~attnlab.inspect.mixing.Mixing`.

    Shape:
        input_ids ``(B, T)``.
    """
    from attnlab.inspect.mixing import MEANING, Mixing, _select, record_layers, row_positions

    t = input_ids.shape[-1]
    if method == "value_zeroing":
        names, per_layer = _value_zeroing(model, input_ids, layers, forward_kwargs)
        if rows is None:
            return Mixing(method, MEANING[method], names, per_layer)
        idx = row_positions(rows, per_layer.shape[-2])
        return Mixing(method, MEANING[method], names, per_layer[:, :, idx], rows=idx)
    idx = row_positions(rows, t)
    check_positive_int("steps", steps)
    if len(idx) > MAX_GRADIENT_LENGTH:
        raise ArgumentError(
            f"{method} runs one backward pass per position: at most {MAX_GRADIENT_LENGTH} "
            f"positions, got {len(idx)} (choose some with rows=)"
        )
    with torch.no_grad():
        logits = getattr(model(input_ids, **forward_kwargs), "logits", None)
    if logits is None:
        raise ArgumentError(
            f"method {method} explains the token each position predicts, and this "
            f"{type(model).__name__} predicts none (no logits): choose a method that reads the "
            "layers (weights, rollout, flow, norm, norm_residual, alti, value_zeroing)"
        )
    targets = logits.argmax(-1)  # (B, T)
    out_rows = None if rows is None else idx
    if method == "grad_weights":
        runs, out = record_layers(model, lambda: model(input_ids, **forward_kwargs), grad=True)
        runs = _select(runs, layers)
        cumulative = _relevance(runs, out, targets, idx)
        names = [r.name for r in runs]
        return Mixing(method, MEANING[method], names, None, total=cumulative[-1],
                      cumulative=cumulative, rows=out_rows)  # fmt: skip
    total = _integrated_gradients(
        model, input_ids, targets, forward_kwargs, idx, baseline_id, steps
    )
    return Mixing(method, MEANING[method], [], None, total=total, rows=out_rows)


def _value_zeroing(
    model: nn.Module, input_ids: torch.Tensor, layers: str | None, forward_kwargs: dict[str, Any]
) -> tuple[list[str], torch.Tensor]:
    from attnlab.inspect.mixing import _block_of, mixed_stacks

    b, t = input_ids.shape
    modules = {
        n: m for n, m in attention_modules(model).items() if layers is None or n.startswith(layers)
    }
    if not modules:
        raise ArgumentError(f"layers={layers!r} selects no attention layer of the model")
    parents = dict(model.named_modules())
    rows = t + 1
    ids = input_ids.repeat_interleave(rows, dim=0)  # (B · (T + 1), T)
    kwargs = {
        k: v.repeat_interleave(rows, dim=0) if isinstance(v, torch.Tensor) else v
        for k, v in forward_kwargs.items()
    }
    j = torch.arange(t)
    names, matrices = [], []
    for name, attn in modules.items():
        block, role = _block_of(parents, name)
        if role == "cross_attn":
            raise ArgumentError(
                f"value_zeroing of {name}, a cross-attention, mixes two sequences: choose the "
                "encoder with layers='encoder.'"
            )
        after = getattr(block, "hook_resid_post", None)
        if not isinstance(after, nn.Module):
            raise ArgumentError(
                f"value_zeroing reads the output of the block around {name}, which has no "
                f"hook_resid_post"
            )
        seen: dict[str, torch.Tensor] = {}

        def zero_values(_m: nn.Module, _a: Any, v: torch.Tensor) -> torch.Tensor:
            if v.shape[-2] != t:  # a cross-attention's memory or a cached call: leave it
                return v
            v = v.clone().unflatten(0, (b, rows))  # (B, T + 1, H_kv, T_k, d_head)
            v[:, j, :, j] = 0.0  # row j: token j's values, every head
            return v.flatten(0, 1)

        def stop(
            _m: nn.Module, _a: Any, out: torch.Tensor, seen: dict[str, torch.Tensor] = seen
        ) -> None:
            seen["out"] = out.detach()
            raise _Stop

        handles = [
            attn.hook_v.register_forward_hook(zero_values),
            after.register_forward_hook(stop),
        ]
        try:
            with torch.no_grad():
                model(ids, **kwargs)
        except _Stop:
            pass
        finally:
            for h in handles:
                h.remove()
        if "out" not in seen:
            continue  # a layer this input does not reach (a decoder layer of a seq2seq)
        out = seen["out"].unflatten(0, (b, rows))  # (B, T + 1, T, d_model)
        zeroed, clean = out[:, :t], out[:, t:]  # ỹ^{¬j}_i: zeroed[:, j, i]
        # c_ij = 1 − cos(ỹ_i^{¬j}, y_i)                                   (B, T_i, T_j)
        cos = torch.nn.functional.cosine_similarity(zeroed, clean.expand_as(zeroed), dim=-1)
        change = (1.0 - cos).transpose(1, 2).clamp(min=0.0)
        total = change.sum(-1, keepdim=True)
        matrices.append(torch.where(total > 0, change / total.clamp(min=1e-300), 0.0))
        names.append(name)
    if len({m.shape for m in matrices}) > 1:
        raise mixed_stacks(names)
    return names, torch.stack(matrices)


def _relevance(
    runs: list[Any], out: Any, targets: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """Chefer et al.'s rolled-out relevance, one backward pass per output position asked for:
    ``R`` after each layer, ``(L, B, R, T)`` (the last is the relevance through every layer;
    ``z = A v`` with a Linformer layer's effective weights and token values: ``∂s/∂(A F)``)."""
    self_runs = runs
    logits = out.logits  # (B, T, V)
    b, t = targets.shape
    if any(r.weights.shape[-1] != t for r in runs):
        raise ArgumentError(
            "grad_weights explains the model's output positions through layers over the same "
            "tokens: an encoder-decoder's encoder layers are over the source (not supported)"
        )
    outputs = [r.call.output for r in self_runs]
    relevance = torch.zeros(len(runs), b, len(rows), t, dtype=logits.dtype, device=logits.device)
    eye = torch.eye(t, dtype=logits.dtype, device=logits.device).expand(b, t, t)
    for n, i in enumerate(rows.tolist()):
        score = logits[:, i].gather(-1, targets[:, i : i + 1]).sum()
        last = n == len(rows) - 1
        grads = torch.autograd.grad(score, outputs, retain_graph=not last, allow_unused=True)
        r = eye.clone()
        for layer, (run, g) in enumerate(zip(self_runs, grads)):
            a = run.weights.detach()
            if g is None:
                relevance[layer, :, n] = r[:, i]
                continue
            heads = a.shape[1]
            v = run.values.detach().repeat_interleave(heads // run.values.shape[1], dim=1)
            grad_a = g @ v.transpose(-2, -1)  # ∂s/∂A = (∂s/∂z) vᵀ              (B, H, T, T)
            # Ā = E_h[(∇A ⊙ A)^+];  R ← R + Ā R
            a_bar = (grad_a * a).clamp(min=0.0).mean(1)
            r = r + a_bar @ r
            relevance[layer, :, n] = r[:, i]
    return relevance.detach()


def _integrated_gradients(
    model: nn.Module,
    input_ids: torch.Tensor,
    targets: torch.Tensor,
    forward_kwargs: dict[str, Any],
    rows: torch.Tensor,
    baseline_id: int,
    steps: int = 32,
) -> torch.Tensor:
    """Captum's integrated gradients on the token embeddings from the embedding of
    ``baseline_id`` at every position, one row per output position asked for."""
    from captum.attr import IntegratedGradients

    embedding = getattr(getattr(model, "transformer", None), "wte", None)
    if not isinstance(embedding, nn.Module):
        raise ArgumentError(
            f"integrated_gradients needs the token embedding of {type(model).__name__} "
            "(model.transformer.wte)"
        )
    vocab = getattr(embedding, "num_embeddings", None)
    if isinstance(vocab, int) and baseline_id >= vocab:
        raise ArgumentError(f"baseline_id must be a token id in [0, {vocab}), got {baseline_id}")
    b, t = input_ids.shape
    with torch.no_grad():
        embedded = embedding(input_ids)  # (B, T, d_model)
        baseline = embedding(torch.full_like(input_ids[:1], baseline_id))  # (1, T, d_model)
    result = torch.zeros(b, len(rows), t, dtype=embedded.dtype, device=embedded.device)
    for row in range(b):
        ids = input_ids[row : row + 1]
        kwargs = {
            k: v[row : row + 1] if isinstance(v, torch.Tensor) else v
            for k, v in forward_kwargs.items()
        }
        for n, i in enumerate(rows.tolist()):

            def forward(
                emb: torch.Tensor,
                i: int = i,
                ids: torch.Tensor = ids,
                kwargs: dict[str, Any] = kwargs,
            ) -> torch.Tensor:
                handle = embedding.register_forward_hook(lambda _m, _a, _o: emb)
                try:
                    out = model(ids.expand(emb.shape[0], t), **kwargs).logits
                finally:
                    handle.remove()
                return out[:, i]  # (n, V): the logits at position i

            ig = IntegratedGradients(forward)
            attributions = ig.attribute(
                embedded[row : row + 1],
                baselines=baseline,
                target=int(targets[row, i]),
                n_steps=steps,
                internal_batch_size=steps,
            )
            result[row, n] = attributions[0].sum(-1).detach()
    return result
