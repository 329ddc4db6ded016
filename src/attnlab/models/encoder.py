"""A BERT-style encoder (Devlin et al. 2019): token, position and token-type embeddings, then
post-norm Transformer layers over the whole sequence (no causal rule), and BERT's pooler.

    E = LayerNorm(W_tok[x] + W_pos[p] + W_type[s])              (embeddings, §3.2)
    h ← LayerNorm(h + MultiHead(h, h, h; padding mask))         (each layer, post-norm, §3.1 of
    h ← LayerNorm(h + GELU(h W_1 + b_1) W_2 + b_2)               Vaswani et al. 2017)
    pooled = tanh(h_[CLS] W_p + b_p)                             (the pooler, where present)

The layers are attnlab's :class:`~attnlab.nn.layers.EncoderLayer` (``norm_first=False``, exact
GELU) and their attention the one :class:`~attnlab.nn.multihead.MultiHeadAttention`: every
backend, head mask, hook and capture works on an encoder as on a decoder. Hugging Face's BERT,
RoBERTa and DistilBERT are read and written by their families (:mod:`attnlab.models.families`,
:mod:`attnlab.models.encoder_hf`); RoBERTa counts positions from ``pad_id + 1`` over the tokens
that are not padding (``position_offset``); DistilBERT has no token types and no pooler;
ELECTRA's embeddings may be narrower than the model, projected to it (``embedding_size``).

:meth:`Encoder.embed` is the sentence embedding of sentence-transformers' models
(all-MiniLM-L6-v2): the mean of the last hidden states over the tokens the attention mask keeps,
normalised to unit length (Reimers & Gurevych 2019).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from attnlab._checks import check_positive_int, check_probability
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.head_mask import layer_head_masks
from attnlab.nn.hooks import HookPoint
from attnlab.nn.layers import EncoderLayer
from attnlab.nn.masks import from_key_padding_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["ENCODER_FAMILIES", "Encoder", "EncoderConfig", "EncoderOutput"]

#: the families an :class:`EncoderConfig` can name
ENCODER_FAMILIES = ("bert", "roberta", "distilbert", "electra")


@dataclass(frozen=True)
class EncoderConfig:
    """The sizes and parts of an :class:`Encoder`.

    Attributes:
        vocab_size: the vocabulary.
        n_positions: the learned absolute positions (BERT's ``max_position_embeddings``).
        d_model: the width.
        n_layer: the layers.
        n_head: the attention heads.
        d_ff: the feed-forward inner width.
        type_vocab_size: token types (segments A/B); 0: no token-type embedding (DistilBERT).
        layer_norm_eps: every LayerNorm's epsilon (BERT's ``1e-12``).
        dropout: the embeddings', residual and feed-forward dropout while training.
        attention_dropout: dropout on the attention weights while training.
        pad_id: the padding token, or ``None``.
        position_offset: ``None``: the position of token ``t`` is ``t`` (BERT); an int ``o``:
            a token that is not ``pad_id`` has position ``o + (its rank among them)`` and padding
            has ``o - 1`` (RoBERTa: ``o = pad_id + 1``).
        pooler: whether the model has BERT's pooler (``tanh`` of a linear map of ``[CLS]``).
        embedding_size: the embeddings' width where it differs from ``d_model`` (ELECTRA): a
            linear map ``embeddings_project`` takes them to ``d_model`` after their LayerNorm;
            ``None`` (default): ``d_model``, no projection.
        family: ``"bert"``, ``"roberta"``, ``"distilbert"`` or ``"electra"`` (how Hugging Face
            names its weights).
    """

    vocab_size: int
    n_positions: int = 512
    d_model: int = 768
    n_layer: int = 12
    n_head: int = 12
    d_ff: int = 3072
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    dropout: float = 0.0
    attention_dropout: float = 0.0
    pad_id: int | None = 0
    position_offset: int | None = None
    pooler: bool = True
    embedding_size: int | None = None
    family: str = "bert"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "d_model", "n_layer", "n_head", "d_ff"):
            check_positive_int(name, getattr(self, name))
        if self.embedding_size is not None:
            check_positive_int("embedding_size", self.embedding_size)
        if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            raise ArgumentError(f"type_vocab_size must be an int ≥ 0, got {self.type_vocab_size!r}")
        if self.d_model % self.n_head:
            raise ArgumentError(
                f"d_model = {self.d_model} must be divisible by n_head = {self.n_head}"
            )
        check_probability("dropout", self.dropout)
        check_probability("attention_dropout", self.attention_dropout)
        if not isinstance(self.layer_norm_eps, float) or not self.layer_norm_eps > 0:
            raise ArgumentError(f"layer_norm_eps must be a float > 0, got {self.layer_norm_eps!r}")
        if self.family not in ENCODER_FAMILIES:
            raise ArgumentError(
                f"family must be one of {', '.join(ENCODER_FAMILIES)}, got {self.family!r}"
            )
        if self.position_offset is not None and self.pad_id is None:
            raise ArgumentError("position_offset needs a pad_id (positions skip the padding)")

    def replace(self, **changes: object) -> EncoderConfig:
        """This config with some fields changed (checked again).

        Args:
            **changes: field → new value.

        Returns:
            The new config.
        """
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass
class EncoderOutput:
    """What :class:`Encoder` returns.

    Attributes:
        last_hidden_state: the last layer's output.
        pooler_output: ``tanh(h_0 W_p + b_p)`` of the first token (``[CLS]``), or ``None``
            (a model without a pooler).
        hidden_states: with ``output_hidden_states=True``, the embeddings' output then each
            layer's (``n_layer + 1`` tensors, as Hugging Face's), else ``None``.

    Shape:
        last_hidden_state ``(B, T, d_model)``; pooler_output ``(B, d_model)``; each hidden
        state ``(B, T, d_model)``.
    """

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


class EncoderEmbeddings(nn.Module):
    """``LayerNorm(W_tok[x] + W_pos[p] + W_type[s])``, then dropout.

    Args:
        config: the :class:`EncoderConfig`.

    Shape:
        input_ids, position_ids, token_type_ids ``(B, T)`` → ``(B, T, e)``, ``e`` the
        ``embedding_size`` (default ``d_model``).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        d = config.embedding_size or config.d_model
        self.word_embeddings = nn.Embedding(config.vocab_size, d)
        self.position_embeddings = nn.Embedding(config.n_positions, d)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, d) if config.type_vocab_size else None
        )
        self.norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        """The embeddings of a batch.

        Args:
            input_ids: token ids.
            position_ids: their positions.
            token_type_ids: their segments (0 where ``None``); ignored without token types.

        Returns:
            The embeddings, normalised.

        Shape:
            ``(B, T)`` each → ``(B, T, e)``.
        """
        # E = W_tok[x] + W_pos[p] + W_type[s]
        e = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            e = e + self.token_type_embeddings(types)
        return self.dropout(self.norm(e))  # (B, T, e)


class Encoder(nn.Module):
    """A BERT-style encoder (see the module docstring).

    Args:
        config: the :class:`EncoderConfig`.

    Shape:
        - input_ids ``(B, T)``; attention_mask ``(B, T)`` (1 or ``True`` = a token, 0 = padding)
        - token_type_ids ``(B, T)``; head_mask ``(n_layer, H)`` or ``(H,)``
        - output: :class:`EncoderOutput`, ``last_hidden_state`` ``(B, T, d_model)``

    Hook points:
        ``hook_embed`` (the embeddings' output), each layer's (``layers.{i}.hook_resid_pre`` …
        ``hook_resid_post``) and its attention's (``layers.{i}.self_attn.hook_weights`` …).

    Examples:
        >>> model = Encoder(EncoderConfig(vocab_size=100, d_model=32, n_layer=2, n_head=4, d_ff=64))
        >>> model(torch.tensor([[1, 5, 7, 2]])).last_hidden_state.shape
        torch.Size([1, 4, 32])
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        if not isinstance(config, EncoderConfig):
            raise ArgumentTypeError(f"config must be an EncoderConfig, got {type(config).__name__}")
        self.config = config
        self.embeddings = EncoderEmbeddings(config)
        e = config.embedding_size or config.d_model
        self.embeddings_project = nn.Linear(e, config.d_model) if e != config.d_model else None
        self.hook_embed = HookPoint()
        self.layers = nn.ModuleList(
            EncoderLayer(
                config.d_model,
                config.n_head,
                config.d_ff,
                activation="gelu",
                dropout=config.dropout,
                attention_dropout=config.attention_dropout,
                norm_first=False,
                layer_norm_eps=config.layer_norm_eps,
            )
            for _ in range(config.n_layer)
        )
        self.pooler = nn.Linear(config.d_model, config.d_model) if config.pooler else None

    @classmethod
    def from_hf(cls, model_or_directory: PreTrainedModel | str | Path) -> Encoder:
        """An encoder with the weights of a ``transformers`` BERT, RoBERTa or DistilBERT, or of
        one saved in a local folder (never downloaded). See
        :func:`attnlab.models.encoder_hf.encoder_from_hf`.

        Args:
            model_or_directory: a ``BertModel`` (…), or a folder as ``save_pretrained`` writes it.

        Returns:
            A new :class:`Encoder` with the same configuration and weights.
        """
        from attnlab.models.encoder_hf import encoder_from_hf

        return encoder_from_hf(model_or_directory)

    def to_hf(self, *, attn_implementation: str = "eager") -> PreTrainedModel:
        """This model's weights in its family's ``transformers`` class (``BertModel`` …). See
        :func:`attnlab.models.encoder_hf.encoder_to_hf`.

        Args:
            attn_implementation: ``"eager"`` (default) or ``"sdpa"``.

        Returns:
            The ``transformers`` model with this model's configuration and weights.
        """
        from attnlab.models.encoder_hf import encoder_to_hf

        return encoder_to_hf(self, attn_implementation=attn_implementation)

    def save_hf(self, directory: str | Path) -> Path:
        """Write this model as a Hugging Face folder (``config.json`` + ``model.safetensors``),
        which ``transformers``' ``AutoModel.from_pretrained`` reads. See
        :func:`attnlab.models.encoder_hf.save_encoder_hf`.

        Args:
            directory: the folder (made when missing; its model files replaced at once).

        Returns:
            The folder.
        """
        from attnlab.models.encoder_hf import save_encoder_hf

        return save_encoder_hf(self, directory)

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The positions of a batch's tokens (see :attr:`EncoderConfig.position_offset`).

            BERT:     p_t = t
            RoBERTa:  p_t = o + Σ_{u<t} [x_u ≠ pad]  for x_t ≠ pad,  o − 1 for padding

        Args:
            input_ids: token ids.

        Returns:
            Position ids.

        Shape:
            ``(B, T)`` → ``(B, T)``.
        """
        offset = self.config.position_offset
        if offset is None:
            t = torch.arange(input_ids.shape[1], device=input_ids.device)
            return t.expand_as(input_ids)
        real = input_ids.ne(self.config.pad_id or 0).long()  # pad_id is set with an offset
        return torch.cumsum(real, dim=1) * real + (offset - 1)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        head_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> EncoderOutput:
        """Encode a batch: every token attends to every token the mask keeps, both ways.

        Args:
            input_ids: token ids, ``[CLS] … [SEP]`` as the tokenizer writes them.
            attention_mask: 1 (``True``) for a token, 0 for padding; ``None``: every token.
                Padding is hidden as a key; its own rows are computed (and ignored by
                :meth:`embed`), as in Hugging Face's models.
            token_type_ids: the segment of each token (0: sentence A, 1: sentence B);
                default 0. Refused for a model without token types.
            head_mask: ``ξ`` of every layer's heads, ``(n_layer, H)`` or ``(H,)``: 1 keeps a
                head, 0 removes it (Hugging Face's ``head_mask``).
            output_hidden_states: also return the embeddings' and every layer's output.

        Returns:
            An :class:`EncoderOutput`.

        Shape:
            - input_ids, attention_mask, token_type_ids ``(B, T)``
            - head_mask ``(n_layer, H)`` or ``(H,)``
            - last_hidden_state ``(B, T, d_model)``; pooler_output ``(B, d_model)``
        """
        mask = self._check_inputs(input_ids, attention_mask, token_type_ids)
        masks = layer_head_masks("head_mask", head_mask, self.config.n_layer, self.config.n_head)
        h = self.embeddings(input_ids, self.position_ids(input_ids), token_type_ids)  # (B, T, e)
        if self.embeddings_project is not None:  # ELECTRA: h ← h W_e + b_e
            h = self.embeddings_project(h)
        h = self.hook_embed(h)  # (B, T, d_model)
        states = [h]
        for layer, xi in zip(self.layers, masks, strict=True):
            h = layer(h, mask=mask, head_mask=xi)  # (B, T, d_model)
            states.append(h)
        # pooled = tanh(h_0 W_p + b_p)
        pooled = None if self.pooler is None else torch.tanh(self.pooler(h[:, 0]))  # (B, d_model)
        return EncoderOutput(h, pooled, tuple(states) if output_hidden_states else None)

    def embed(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        normalize: bool = True,
    ) -> torch.Tensor:
        """Sentence embeddings: the mean of the last hidden states over the tokens the attention
        mask keeps, normalised to unit length (sentence-transformers' all-MiniLM-L6-v2).

            e = Σ_t m_t h_t / max(Σ_t m_t, 1e-9),   e ← e / max(‖e‖₂, 1e-12)

        Args:
            input_ids: token ids (``[CLS] … [SEP]``), padded.
            attention_mask: 1 for a token, 0 for padding; ``None``: every token.
            token_type_ids: segments, as :meth:`forward`.
            normalize: divide by the L2 norm (default ``True``; ``False``: the mean alone).

        Returns:
            One embedding per row.

        Shape:
            input_ids, attention_mask ``(B, T)`` → ``(B, d_model)``.
        """
        h = self(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, d)
        m = (
            torch.ones_like(input_ids, dtype=h.dtype)
            if attention_mask is None
            else attention_mask.to(h.dtype)
        )[..., None]  # (B, T, 1)
        e = (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)  # (B, d)
        return F.normalize(e, p=2, dim=-1) if normalize else e

    def _check_inputs(
        self,
        input_ids: object,
        attention_mask: object,
        token_type_ids: object,
    ) -> torch.Tensor | None:
        """The checked inputs' key mask ``(B, 1, 1, T)`` (``True`` = a token), or ``None``."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.long:
            got = input_ids.dtype if isinstance(input_ids, torch.Tensor) else type(input_ids)
            raise ArgumentTypeError(f"input_ids must be a torch.long tensor, got {got}")
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ArgumentError(
                f"input_ids must have shape (B, T), T ≥ 1, got {tuple(input_ids.shape)}"
            )
        t = input_ids.shape[1]
        limit = self.config.n_positions - (self.config.position_offset or 0)
        if t > limit:
            raise ArgumentError(
                f"input_ids has {t} tokens, more than the model's {limit} positions"
            )
        for name, value in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise ArgumentTypeError(f"{name} must be a tensor, got {type(value).__name__}")
            if tuple(value.shape) != tuple(input_ids.shape):
                raise ArgumentError(
                    f"{name} must have the shape of input_ids {tuple(input_ids.shape)}, got "
                    f"{tuple(value.shape)}"
                )
        if isinstance(token_type_ids, torch.Tensor):
            if self.config.type_vocab_size == 0:
                raise ArgumentError(
                    f"token_type_ids must be None: a {self.config.family} model has no token types"
                )
            if token_type_ids.dtype != torch.long:
                raise ArgumentTypeError(
                    f"token_type_ids must be a torch.long tensor, got {token_type_ids.dtype}"
                )
        if not isinstance(attention_mask, torch.Tensor):
            return None
        if attention_mask.is_floating_point() or attention_mask.is_complex():
            raise ArgumentTypeError(
                f"attention_mask must hold 0/1 integers or bools, got {attention_mask.dtype}"
            )
        return from_key_padding_mask(attention_mask == 0)  # (B, 1, 1, T), True = a token
