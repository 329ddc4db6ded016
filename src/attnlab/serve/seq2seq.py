"""An encoder-decoder behind ``attnlab serve``: the source and the target, each layer's encoder
self-, decoder self- and cross-attention, the next target token and greedy decoding.

A request names the source by ``text`` and the target (what the decoder has written after
``<bos>``) by ``target_ids``, or by ``target`` text (the target tokenizer's ids, a prefix), or by neither:
then the model's own output, decoded as ``attnlab translate`` decodes it
(:meth:`~attnlab.tasks.seq2seq.Seq2SeqIO.inputs`: the run's own greedy or beam decoding).

* the attention: :func:`~attnlab.tasks.figures.capture_inputs` and
  :func:`~attnlab.tasks.figures.viewer_for` of the teacher-forced ``<bos> target``, ``attnlab
  view``'s page of an encoder-decoder (its rows labelled by what each decoder row wrote);
* the next target token: :func:`~attnlab.decoding.strategies.sampling_distribution` of the
  decoder's last logits after the whole target;
* "generate N": greedy decoding after the target, each token the argmax of the logits the
  next-token bars show; from an empty target these are the tokens ``attnlab translate`` decodes
  greedily (with its KV cache); it stops at ``<eos>``. A ``target`` text is a prefix (no
  ``<eos>`` is added).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.errors import AttnlabError
from attnlab.inspect.capture import ActivationCache
from attnlab.serve.requests import FieldError, Sampling, check_ids
from attnlab.serve.session import Session
from attnlab.tasks.base import ModelInputs, token_labels
from attnlab.tasks.figures import capture_inputs
from attnlab.tasks.seq2seq import Seq2SeqIO, strip_special

__all__ = ["Seq2SeqSession", "Target"]


@dataclass(frozen=True)
class Target:
    """What one request asks of an encoder-decoder: the encoder's ids and the decoder's.

    Attributes:
        source: what the encoder reads (the task's suffix included).
        target: what the decoder has written after ``<bos>`` (``<eos>`` included, if written).
    """

    source: tuple[int, ...]
    target: tuple[int, ...]


class Seq2SeqSession(Session):
    """A :class:`~attnlab.serve.session.Session` of an :class:`attnlab.Transformer`.

    Args:
        model: the encoder-decoder (eval mode is set).
        io: its text path (:class:`~attnlab.tasks.seq2seq.Seq2SeqIO`).
        title: shown on the page.
        max_tokens: the longest source, and the longest target, a request may run (at most the
            model's ``max_len``).
    """

    io: Seq2SeqIO  # type: ignore[assignment]

    @property
    def context(self) -> int:
        """The longest source or target the model takes (its ``max_len``)."""
        cfg: Any = self.model.config
        return int(cfg.max_len)

    @property
    def vocab_size(self) -> int:
        """The target vocabulary's size."""
        cfg: Any = self.model.config
        return int(cfg.tgt_vocab_size)

    def info(self) -> dict[str, Any]:
        """:meth:`Session.info` with ``kind`` ``"seq2seq"``.

        Returns:
            As :meth:`Session.info`, and ``kind``.
        """
        return {**super().info(), "kind": "seq2seq"}

    def labels(self, ids: Sequence[int]) -> list[str]:
        """Each target token's text.

        Args:
            ids: target token ids.

        Returns:
            One label per id.
        """
        return token_labels(self.io.tgt_tok, ids)

    # ------------------------------------------------------------------ the request's tokens
    def read(self, body: Mapping[str, Any], text: str) -> Target:
        """The source of ``text`` and the request's target (see the module docstring).

        Args:
            body: the request (``target`` or ``target_ids``, or neither).
            text: the source text, checked.

        Returns:
            A :class:`Target`.

        Raises:
            FieldError: the source or the target cannot be read, or is too long.
        """
        try:
            source = self.io.encode_source(text)
        except AttnlabError as exc:
            raise FieldError("text", f"text: {exc}") from None
        self.check_length(source, "text")
        if "target_ids" in body and "target" in body:
            raise FieldError("target", "send target (text) or target_ids, not both")
        if body.get("target_ids") == []:  # the decoder has read <bos> only
            target = []
        elif "target_ids" in body:
            target = check_ids(body["target_ids"], self.vocab_size, "target_ids")
        elif "target" in body:
            value = body["target"]
            if not isinstance(value, str):
                raise FieldError("target", f"target must be a string, got {type(value).__name__}")
            target = list(self.io.tgt_tok.encode(value))  # a prefix: no <eos> added
        else:  # the model's own output, as attnlab translate decodes it
            key = ("translate", tuple(source))
            with self.running():
                decoded = self.remember(key, lambda: self.io.inputs(self.model, text,
                                                                    source_ids=source))  # fmt: skip
            target = list(decoded.target_ids[1:])
        self.check_length(target, "target" if "target" in body else "target_ids")
        return Target(tuple(source), tuple(target))

    def model_inputs(self, t: Target) -> ModelInputs:
        """What the model reads for ``t``, teacher-forced (``attnlab view``'s inputs).

        Args:
            t: the source and the target.

        Returns:
            The :class:`~attnlab.tasks.base.ModelInputs` (``target_ids``: ``<bos>`` first).
        """
        io = self.io
        tgt = [io.bos_id, *t.target]
        shown = strip_special(tgt, bos_id=io.bos_id, eos_id=io.eos_id, pad_id=io.pad_id)
        return ModelInputs(
            kind="seq2seq", source_ids=t.source, target_ids=tuple(tgt),
            source_tokens=tuple(token_labels(io.src_tok, t.source)),
            target_tokens=tuple(self.labels(t.target)), output=io.decode_output(shown),
        )  # fmt: skip

    def tokens(self, t: Target) -> dict[str, Any]:
        """The request's tokens as the page shows them.

        Args:
            t: the source and the target.

        Returns:
            ``source_ids``, ``source_tokens``, ``target_ids``, ``target_tokens``, ``output``.
        """
        return {
            "source_ids": list(t.source),
            "source_tokens": token_labels(self.io.src_tok, t.source),
            "target_ids": list(t.target),
            "target_tokens": self.labels(t.target),
            "output": self.model_inputs(t).output,
        }

    # ------------------------------------------------------------------ what is computed
    def attention(self, t: Target) -> ActivationCache:
        """The capture of every layer on ``t`` (encoder self, decoder self, cross), cached.

        Args:
            t: the source and the target.

        Returns:
            The :class:`~attnlab.inspect.ActivationCache`.

        Raises:
            FieldError: the target is empty (no decoder row wrote anything).
        """
        if not t.target:
            raise FieldError("target_ids", "target_ids is empty: the decoder has written no "
                             "token to show yet; generate one first")  # fmt: skip
        inputs = self.model_inputs(t)
        return self.remember(("capture", t), lambda: capture_inputs(self.model, inputs))

    def next_target(self, t: Target, sampling: Sampling, top: int) -> dict[str, Any]:
        """The next target token's distribution after the whole target (as
        :meth:`Session.next_token`: ``π = softmax(filter(z / τ))``).

        Args:
            t: the source and the target so far.
            sampling: temperature, top-k, top-p.
            top: how many of the likeliest tokens to list.

        Returns:
            As :meth:`Session.next_token`.
        """
        return self.ranked(self.last_logits(t), sampling, top)

    def last_logits(self, t: Target) -> torch.Tensor:
        """The decoder's logits after ``<bos>`` and the whole target (cached per target).

        Args:
            t: the source and the target so far.

        Returns:
            ``(1, V)`` logits.

        Shape:
            ``(1, V)``.
        """
        device = next(self.model.parameters()).device
        src = torch.tensor([list(t.source)], device=device)
        tgt = torch.tensor([[self.io.bos_id, *t.target]], device=device)
        return self.remember(("logits", t), lambda: self.model(src, tgt).logits[:, -1])

    def decode(self, t: Target, n: int) -> Target:
        """``n`` more target tokens by greedy decoding after the target, each the argmax of the
        logits the next-token bars show (from an empty target: the tokens ``attnlab translate``
        decodes greedily); it stops at ``<eos>``.

        Args:
            t: the source and the target so far.
            n: how many to add.

        Returns:
            The source and the decoded target.

        Raises:
            FieldError: the target and ``n`` together past :attr:`max_tokens`.
        """
        self.check_length(t.target, "n", n)
        for _ in range(n):  #  y_{t+1} = argmax_v z_v,   z = model(source, <bos> y_1 … y_t)[-1]
            if t.target and t.target[-1] == self.io.eos_id:
                break
            t = Target(t.source, (*t.target, int(self.last_logits(t)[0].argmax())))
        return t
