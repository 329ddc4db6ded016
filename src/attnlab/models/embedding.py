"""Sentence embeddings from texts: an encoder's tokenizer with its special tokens (``[CLS] … [SEP]``
as its ``tokenizer.json`` post-processor writes them), a padded batch, and
:meth:`~attnlab.models.encoder.Encoder.embed` (mean pooling over the attention mask, then L2
normalisation: sentence-transformers' all-MiniLM-L6-v2).

Examples:
    >>> import attnlab
    >>> e = attnlab.embed(["A cat sits.", "A dog runs."])         # minilm-l6, (2, 384)
    >>> float(e[0] @ e[1])                                        # cosine similarity
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.encoder import Encoder

__all__ = ["embed", "encode_texts"]


def encode_texts(
    tokenizer: Any, texts: Sequence[str], *, max_length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded batch of texts with their special tokens, as a ``transformers`` tokenizer's
    ``tokenizer(texts, padding=True)`` gives it.

    Args:
        tokenizer: a :class:`~attnlab.data.pretrained_tokenizer.PretrainedTokenizer` (or any
            tokenizer wrapping a ``tokenizers.Tokenizer`` as ``.tokenizer``, with ``pad_id``).
        texts: the texts.
        max_length: refuse a text of more tokens (the model's positions); ``None``: no limit.

    Returns:
        ``(input_ids, attention_mask)``, padding on the right with the tokenizer's pad id.

    Shape:
        input_ids, attention_mask ``(B, T)``, ``T`` the longest text's tokens.
    """
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise ArgumentTypeError(f"texts must be a list of str, got {type(texts).__name__}")
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ArgumentTypeError("texts must be a non-empty list of str")
    backend = getattr(tokenizer, "tokenizer", None)
    if backend is None or not hasattr(backend, "encode_batch"):
        raise ArgumentTypeError(
            f"tokenizer must wrap a tokenizers.Tokenizer, got {type(tokenizer).__name__}"
        )
    # a tokenizer.json may pad (all-MiniLM-L6-v2's pads to 128) or truncate; transformers'
    # tokenizers turn both off unless asked: the padding is taken off, a cut text refused
    encodings = backend.encode_batch(list(texts), add_special_tokens=True)
    for i, e in enumerate(encodings):
        if e.overflowing:
            raise ArgumentError(
                f"texts[{i}] is longer than the tokenizer's truncation length "
                f"({len(e.ids)} tokens); shorten it"
            )
    rows = [[t for t, m in zip(e.ids, e.attention_mask, strict=True) if m] for e in encodings]
    longest = max(len(r) for r in rows)
    if max_length is not None and longest > max_length:
        i = max(range(len(rows)), key=lambda j: len(rows[j]))
        raise ArgumentError(
            f"texts[{i}] has {longest} tokens, more than the model's {max_length} positions"
        )
    pad = getattr(tokenizer, "pad_id", None) or 0
    ids = torch.full((len(rows), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


@torch.no_grad()
def embed(
    texts: Sequence[str],
    model: str | Encoder = "minilm-l6",
    tokenizer: Any = None,
    *,
    normalize: bool = True,
) -> torch.Tensor:
    """Sentence embeddings of texts: mean pooling of the encoder's last hidden states over each
    text's tokens, normalised to unit length (so ``e @ e.T`` is the cosine similarity).

    Args:
        texts: the texts (one batch).
        model: an :class:`~attnlab.models.encoder.Encoder` (give its ``tokenizer`` too), or a
            source :func:`attnlab.load_pretrained` reads (default the bundled ``"minilm-l6"``).
        tokenizer: the model's tokenizer, when ``model`` is a model.
        normalize: divide each embedding by its L2 norm (default ``True``).

    Returns:
        One embedding per text, float32 on the model's device.

    Shape:
        ``(len(texts), d_model)``.
    """
    if not isinstance(model, Encoder):
        from attnlab.models.pretrained import load_pretrained

        loaded, tokenizer = load_pretrained(model)
        if not isinstance(loaded, Encoder):
            raise ArgumentError(f"model must be an encoder (e.g. 'minilm-l6'), got {model!r}")
        model = loaded
    if tokenizer is None:
        raise ArgumentError("tokenizer must be given with a model object, got None")
    limit = model.config.n_positions - (model.config.position_offset or 0)
    ids, mask = encode_texts(tokenizer, texts, max_length=limit)
    device = model.embeddings.word_embeddings.weight.device
    return model.embed(ids.to(device), mask.to(device), normalize=normalize)
