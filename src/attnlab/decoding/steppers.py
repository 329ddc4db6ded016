"""Steppers: one interface over both model families for the decoding loops.

A stepper owns the KV cache of one generation call. :meth:`prefill` runs the prompt (decoder-only)
or encodes the source and feeds ``<bos>`` (encoder-decoder) and returns the next-token logits;
:meth:`step` feeds one new token per row and returns the logits after it; :meth:`reorder` selects
rows (beam search).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from attnlab.nn import masks

__all__ = ["CausalStepper", "Seq2SeqStepper", "Stepper"]


class Stepper(Protocol):
    """What the decoding loops need from a model."""

    def prefill(self) -> torch.Tensor:
        """Run the prompt (or encode the source and feed ``<bos>``), filling the cache.

        Returns:
            The logits of the next token after the prompt.

        Shape:
            ``(N, V)``: ``N`` rows, ``V`` the vocabulary size.
        """
        ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one new token per row.

        Args:
            tokens: the token chosen for each row.

        Returns:
            The logits of the token after them.

        Shape:
            tokens ``(N,)`` → logits ``(N, V)``.
        """
        ...

    def reorder(self, index: torch.Tensor) -> None:
        """Select rows (beam search): row ``n`` becomes old row ``index[n]`` (cache and masks).

        Args:
            index: integer row indices on the model's device; may repeat rows.

        Shape:
            index ``(N_new,)``.
        """
        ...


class CausalStepper:
    """A decoder-only model (:class:`attnlab.GPT` protocol) with a preallocated KV cache.

    Args:
        model: has ``forward(input_ids, attention_mask, *, cache)`` and ``new_cache``.
        input_ids: prompt ``(N, T)``, left-padded when ``attention_mask`` has zeros.
        attention_mask: ``(N, T)`` 0/1, or ``None`` when no row is padded.
        capacity: cache size, ``T + max_new_tokens``.
        cache: the cache to decode from (e.g. a sink cache); default ``model.new_cache``.

    Shape:
        input_ids and attention_mask ``(N, T)``; ``N`` rows (batch × beams), ``T`` prompt length.

    The prompt goes through ``model.forward`` (which checks it); each later token through
    ``model.decode_step`` where the model has one (:meth:`attnlab.GPT.decode_step`: the same
    forward, without the checks that read values back from the device), else ``forward``.
    """

    def __init__(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        capacity: int,
        cache: Any = None,
    ) -> None:
        n, t = input_ids.shape
        self.model = model
        self.input_ids = input_ids
        # the model's own cache, or one given (a sink cache)
        self.cache = (
            model.new_cache(n, capacity, device=input_ids.device) if cache is None else cache
        )
        self.length = t
        self.mask: torch.Tensor | None = None
        if attention_mask is not None:
            # preallocated: the mask of past + new tokens is a prefix view at every step
            self.mask = torch.ones(n, capacity, dtype=torch.bool, device=input_ids.device)
            self.mask[:, :t] = attention_mask.bool()
        self.decode_step = getattr(model, "decode_step", None)

    def _visible(self) -> torch.Tensor | None:
        return None if self.mask is None else self.mask[:, : self.length]

    def prefill(self) -> torch.Tensor:
        """Run the prompt through ``model.forward``, filling the cache.

        Returns:
            The logits of the token after the prompt.

        Shape:
            ``(N, V)``.
        """
        out = self.model(self.input_ids, attention_mask=self._visible(), cache=self.cache)
        return out.logits[:, -1]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row through ``model.decode_step`` (or ``forward``).

        Args:
            tokens: the new token of each row.

        Returns:
            The logits of the token after them.

        Shape:
            tokens ``(N,)`` → logits ``(N, V)``.
        """
        self.length += 1
        if self.decode_step is not None:
            return self.decode_step(tokens[:, None], self.cache, self._visible())
        out = self.model(tokens[:, None], attention_mask=self._visible(), cache=self.cache)
        return out.logits[:, -1]

    def reorder(self, index: torch.Tensor) -> None:
        """Select rows of the cache and of the padding mask: row ``n`` becomes old row ``index[n]``.

        Args:
            index: integer row indices on the model's device; may repeat rows.

        Shape:
            index ``(N_new,)``.
        """
        self.cache.reorder(index)
        if self.mask is not None:
            self.mask = self.mask.index_select(0, index)


class Seq2SeqStepper:
    """An encoder-decoder model (:class:`attnlab.Transformer` protocol): encode once, then decode
    from ``<bos>`` with a KV cache (the cross-attention keys/values are computed on the first step).

    Args:
        model: has ``encode``, ``decode`` and ``new_cache``, and ``config.pad_id`` / ``bos_id``.
        src: source ids ``(N, S)``.
        src_mask: ``(N, S)`` 0/1 (1 = real token), or ``None`` for ``src != pad_id``.
        capacity: target positions, ``1 + max_new_tokens``.

    Shape:
        src and src_mask ``(N, S)``; ``N`` rows (batch × beams), ``S`` source length.
    """

    def __init__(
        self, model: Any, src: torch.Tensor, src_mask: torch.Tensor | None, capacity: int
    ) -> None:
        cfg = model.config
        n, s = src.shape
        self.model = model
        if src_mask is None:
            self.src_mask = masks.padding_mask(src, cfg.pad_id)  # (N, 1, 1, S), True = attend
        else:
            self.src_mask = src_mask.bool()[:, None, None, :]
        self.memory = model.encode(src, self.src_mask)  # (N, S, d_model)
        self.cache = model.new_cache(n, capacity, device=src.device, src_len=s)
        self.bos = torch.full((n, 1), cfg.bos_id, dtype=torch.long, device=src.device)

    def _decode(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.model.decode(tokens, self.memory, src_mask=self.src_mask, cache=self.cache)
        return out.logits[:, -1]

    def prefill(self) -> torch.Tensor:
        """Feed ``<bos>`` to the decoder (the source was encoded at construction).

        Returns:
            The logits of the first target token.

        Shape:
            ``(N, V)``.
        """
        return self._decode(self.bos)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one target token per row to the decoder.

        Args:
            tokens: the new token of each row.

        Returns:
            The logits of the token after them.

        Shape:
            tokens ``(N,)`` → logits ``(N, V)``.
        """
        return self._decode(tokens[:, None])

    def reorder(self, index: torch.Tensor) -> None:
        """Select rows of the cache, the encoder memory and the source mask.

        Args:
            index: integer row indices on the model's device; may repeat rows.

        Shape:
            index ``(N_new,)``.
        """
        self.cache.reorder(index)
        self.memory = self.memory.index_select(0, index)
        self.src_mask = self.src_mask.index_select(0, index)
