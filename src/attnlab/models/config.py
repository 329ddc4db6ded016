"""Model configurations: frozen dataclasses, validated in ``__post_init__``, saved as JSON."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from attnlab._checks import check_choice, check_positive_int, check_probability
from attnlab.nn.backends import check_backend

__all__ = [
    "ATTENTIONS",
    "GPTConfig",
    "TransformerConfig",
    "check_attention",
    "config_from_dict",
    "config_to_dict",
]

C = TypeVar("C")

#: the attention patterns a model config can choose (``attention=``)
ATTENTIONS: tuple[str, ...] = ("full", "sliding", "linformer", "performer")


def check_attention(
    attention: object,
    window: object,
    linformer_k: object,
    num_features: object,
    *,
    causal_only: bool,
) -> None:
    """Validate a config's choice of attention and its parameters (shared by both configs).

    Args:
        attention: one of :data:`ATTENTIONS`.
        window: the sliding window ``w`` (``attention="sliding"`` only, required there).
        linformer_k: Linformer's projected length ``k`` (``attention="linformer"`` only,
            required there).
        num_features: Performer's random features ``m`` (``attention="performer"`` only;
            ``None`` takes the layer's default).
        causal_only: the model has causal self-attention only (GPT): Linformer is refused.

    Raises:
        ValueError: an unknown attention name, a parameter for another attention, a missing
            or non-positive parameter, or Linformer in a causal-only model.
        TypeError: a parameter that is not an int.
    """
    if attention == "bigbird":
        raise ValueError(
            f"attention='bigbird' is not available yet; attention must be one of "
            f"{', '.join(repr(a) for a in ATTENTIONS)}"
        )
    check_choice("attention", attention, ATTENTIONS)
    params = {"window": ("sliding", window), "linformer_k": ("linformer", linformer_k),
              "num_features": ("performer", num_features)}  # fmt: skip
    for name, (owner, value) in params.items():
        if value is None:
            if attention == owner and name != "num_features":
                raise ValueError(f"attention={owner!r} needs {name} (a positive int), got None")
            continue
        if attention != owner:
            raise ValueError(
                f"{name} applies to attention={owner!r} only, got {name}={value!r} with "
                f"attention={attention!r}"
            )
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        check_positive_int(name, value)
    if causal_only and attention == "linformer":
        raise ValueError(
            "attention='linformer' is not available for GPTConfig: Linformer projects the keys "
            "along the sequence, so every projected key mixes future positions and the method "
            "cannot be causal; use 'sliding' or 'performer' (or linformer in a TransformerConfig "
            "encoder)"
        )


def config_to_dict(config: Any) -> dict[str, Any]:
    """A config (a dataclass instance) as a JSON-ready dict, with its class name under ``"kind"``.

    Args:
        config: a :class:`GPTConfig` or :class:`TransformerConfig` (any dataclass instance).

    Returns:
        ``{"kind": <class name>, <field>: <value>, ...}``; with full attention (the default)
        the attention fields (``attention``, ``window``, ``linformer_k``, ``num_features``) are
        left out, as in configs saved before they existed.
    """
    data = dataclasses.asdict(config)
    if data.get("attention") == "full":
        # the attention fields are left out at their defaults: a run saved before they existed
        # compares equal when resumed, and config_from_dict fills them in
        for name in ("attention", "window", "linformer_k", "num_features"):
            data.pop(name, None)
    return {"kind": type(config).__name__, **data}


def config_from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Rebuild a config of dataclass ``cls`` (the first argument, e.g. :class:`GPTConfig`);
    unknown keys are an error that names them.

    Args:
        data: its fields, as :func:`config_to_dict` wrote them (a ``"kind"`` key is ignored).

    Returns:
        The validated config.

    Raises:
        ValueError: ``data`` has a key that is not a field of ``cls`` (or a value the config
            rejects).
    """
    data = {k: v for k, v in data.items() if k != "kind"}
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
    return cls(**data)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Configuration of :class:`attnlab.Transformer`, the encoder-decoder of Vaswani et al. (2017).

    Defaults are the paper's base model (§3, Table 3): ``d_model = 512``, 6 + 6 layers, 8 heads,
    ``d_ff = 2048``, dropout 0.1, label smoothing 0.1 (§5.4), post-norm residuals (§3.1), and a
    shared vocabulary of about 37000 tokens (§5.1).

    Args:
        src_vocab_size: source token ids. Default 37000.
        tgt_vocab_size: target token ids. Default 37000.
        d_model: model width; must be divisible by ``num_heads``. Default 512.
        num_heads: attention heads ``H``. Default 8.
        num_kv_heads: key/value heads ``H_kv`` (grouped-query attention); ``None`` means ``num_heads``.
        num_encoder_layers: encoder layers ``N``. Default 6.
        num_decoder_layers: decoder layers ``N``. Default 6.
        d_ff: feed-forward inner width (§3.3). Default 2048.
        dropout: residual dropout, also on embeddings + positions (§5.4). Default 0.1.
        attention_dropout: dropout on attention weights. Default 0.0.
        activation: feed-forward activation, ``"relu"`` (the paper) or ``"gelu"``.
        norm_first: pre-norm residuals instead of the paper's post-norm. Default False.
        layer_norm_eps: LayerNorm ``eps``. Default 1e-5.
        label_smoothing: ``ε_ls`` of the training loss (§5.4). Default 0.1.
        share_embeddings: one embedding matrix for source and target (needs equal vocab sizes).
        tie_output: the output projection reuses the target embedding matrix (§3.4). Default True.
        max_len: longest source or target sequence (the sinusoidal table's length). Default 1024.
        pad_id: padding id (ignored by the loss, hidden by the masks). Default 0.
        bos_id: target start id. Default 1.
        eos_id: end-of-sequence id. Default 2.
        backend: attention backend (see :func:`attnlab.scaled_dot_product_attention`). Default "auto".
        gradient_checkpointing: recompute each encoder and decoder layer's activations in the
            backward pass while training (less memory, about one more forward of compute), as
            :class:`GPTConfig` does. Default False.
        attention: the self-attention pattern, one of :data:`ATTENTIONS` (default ``"full"``).
            Cross-attention is always full.

            * ``"sliding"``: local attention. Encoder self-attention uses the symmetric window
              ``(window, window)`` (each source token sees ``window`` tokens on each side and
              itself, as Longformer's local attention); decoder self-attention the causal window
              ``(window, 0)`` (itself and the ``window`` tokens before it, Mistral's), with a
              rolling KV cache of ``window`` positions while decoding.
            * ``"linformer"``: encoder self-attention only
              (:class:`~attnlab.nn.linformer.LinformerAttention` with ``k = linformer_k`` and
              ``max_len`` columns); the decoder's causal self-attention stays full, as Linformer
              cannot be causal.
            * ``"performer"``: encoder self-attention bidirectional and decoder self-attention
              causal FAVOR+ (:class:`~attnlab.nn.performer.PerformerAttention`). The decoder
              then has no KV cache: decoding recomputes the target prefix at each step.
        window: the sliding window ``w`` (``attention="sliding"`` only, required there).
        linformer_k: Linformer's projected length ``k`` (``attention="linformer"`` only,
            required there).
        num_features: Performer's random features ``m`` (``attention="performer"`` only);
            ``None`` (default) takes ``round(d_head · ln d_head)``.

    Examples:
        >>> cfg = TransformerConfig(src_vocab_size=100, tgt_vocab_size=100, d_model=64,
        ...                         num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=128)
    """

    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000
    d_model: int = 512
    num_heads: int = 8
    num_kv_heads: int | None = None
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: str = "relu"
    norm_first: bool = False
    layer_norm_eps: float = 1e-5
    label_smoothing: float = 0.1
    share_embeddings: bool = False
    tie_output: bool = True
    max_len: int = 1024
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    backend: str = "auto"
    gradient_checkpointing: bool = False
    attention: str = "full"
    window: int | None = None
    linformer_k: int | None = None
    num_features: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "num_encoder_layers",
            "num_decoder_layers", "d_ff", "max_len",
        ):  # fmt: skip
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model = {self.d_model} must be divisible by num_heads = {self.num_heads}"
            )
        if self.num_kv_heads is not None:
            check_positive_int("num_kv_heads", self.num_kv_heads)
            if self.num_heads % self.num_kv_heads != 0:
                raise ValueError(
                    f"num_heads = {self.num_heads} must be a multiple of "
                    f"num_kv_heads = {self.num_kv_heads}"
                )
        check_probability("dropout", self.dropout)
        check_probability("attention_dropout", self.attention_dropout)
        check_probability("label_smoothing", self.label_smoothing)
        check_choice("activation", self.activation, ("relu", "gelu"))
        check_backend(self.backend)
        for name in ("norm_first", "share_embeddings", "tie_output", "gradient_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps <= 0:
            raise ValueError(f"layer_norm_eps must be a positive float, got {eps!r}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if not 0 <= value < self.tgt_vocab_size:
                raise ValueError(
                    f"{name} must lie in [0, tgt_vocab_size = {self.tgt_vocab_size}), got {value}"
                )
        if self.pad_id >= self.src_vocab_size:
            raise ValueError(
                f"pad_id must lie in [0, src_vocab_size = {self.src_vocab_size}), got {self.pad_id}"
            )
        for name in ("bos_id", "eos_id"):
            if getattr(self, name) == self.pad_id:
                raise ValueError(
                    f"{name} must differ from pad_id (padding is masked and ignored by the loss), "
                    f"got {name} = pad_id = {self.pad_id}"
                )
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"share_embeddings=True needs src_vocab_size == tgt_vocab_size, got "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}"
            )
        check_attention(
            self.attention, self.window, self.linformer_k, self.num_features, causal_only=False
        )

    @property
    def d_head(self) -> int:
        """Head dimension ``d_model / num_heads``."""
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads actually used (``num_kv_heads`` or ``num_heads``)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Configuration of :class:`attnlab.GPT`, a GPT-2 style decoder (Radford et al. 2019).

    Defaults are GPT-2 small (124M parameters).

    Args:
        vocab_size: number of token ids. Default 50257.
        n_positions: longest sequence (the learned position table's length; also the limit for
            rope and alibi). Default 1024.
        n_embd: model width ``d_model``. Default 768.
        n_layer: number of blocks. Default 12.
        n_head: query heads ``H``; must divide ``n_embd``. Default 12.
        num_kv_heads: key/value heads ``H_kv`` (grouped-query attention); ``None`` means ``n_head``.
        positions: ``"learned"`` (GPT-2's ``wpe``), ``"rope"`` (rotary) or ``"alibi"`` (linear biases).
        dropout: dropout on embeddings, attention weights and residual branches. Default 0.0.
        gradient_checkpointing: recompute each block's activations in the backward pass while
            training (less memory, about one more forward of compute). Default False.
        layer_norm_epsilon: LayerNorm ``eps``. Default 1e-5.
        bias: biases in the linear layers and LayerNorms. Default True (GPT-2).
        backend: attention backend (see :func:`attnlab.scaled_dot_product_attention`). Default "auto".
        rope_base: base ``θ`` of the rotary frequencies (``positions="rope"`` only). Default 10000.
        attention: the self-attention pattern, one of ``"full"`` (default), ``"sliding"`` and
            ``"performer"`` (:data:`ATTENTIONS`; ``"linformer"`` is refused: it cannot be causal).

            * ``"sliding"``: each token sees itself and the ``window`` tokens before it (the
              causal window ``(window, 0)``, Mistral's ``sliding_window``); decoding keeps a
              rolling KV cache of ``window`` positions.
            * ``"performer"``: causal FAVOR+ (:class:`~attnlab.nn.performer.PerformerAttention`,
              Choromanski et al. 2021) with GPT-2's ``c_attn``/``c_proj`` names. Needs
              ``positions="learned"`` (the layer applies neither rotary embeddings nor the
              additive ALiBi bias). It has no KV cache: :meth:`GPT.new_cache` gives a
              :class:`~attnlab.models.gpt.RecomputeCache` and each decoding step recomputes the
              prefix.

            Hugging Face interop (``to_hf``) needs ``"full"``.
        window: the sliding window ``w`` (``attention="sliding"`` only, required there).
        linformer_k: accepted for symmetry with :class:`TransformerConfig`; must be ``None``.
        num_features: Performer's random features ``m`` (``attention="performer"`` only);
            ``None`` (default) takes ``round(d_head · ln d_head)``.
    """

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    num_kv_heads: int | None = None
    positions: str = "learned"
    dropout: float = 0.0
    gradient_checkpointing: bool = False
    layer_norm_epsilon: float = 1e-5
    bias: bool = True
    backend: str = "auto"
    rope_base: float = 10000.0
    attention: str = "full"
    window: int | None = None
    linformer_k: int | None = None
    num_features: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            check_positive_int(name, getattr(self, name))
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd = {self.n_embd} must be divisible by n_head = {self.n_head}")
        if self.num_kv_heads is not None:
            check_positive_int("num_kv_heads", self.num_kv_heads)
            if self.n_head % self.num_kv_heads != 0:
                raise ValueError(
                    f"n_head = {self.n_head} must be a multiple of num_kv_heads = {self.num_kv_heads}"
                )
        check_choice("positions", self.positions, ("learned", "rope", "alibi"))
        if self.positions == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"positions='rope' needs an even head dimension n_embd / n_head, "
                f"got {self.n_embd} / {self.n_head} = {self.n_embd // self.n_head}"
            )
        check_probability("dropout", self.dropout)
        for name in ("gradient_checkpointing", "bias"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        for name in ("layer_norm_epsilon", "rope_base"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive float, got {value!r}")
        check_backend(self.backend)
        check_attention(
            self.attention, self.window, self.linformer_k, self.num_features, causal_only=True
        )
        if self.attention == "performer" and self.positions != "learned":
            raise ValueError(
                f"attention='performer' needs positions='learned' (the FAVOR+ layer applies "
                f"neither rotary embeddings nor ALiBi's additive bias), got "
                f"positions={self.positions!r}"
            )

    @property
    def d_head(self) -> int:
        """Head dimension ``n_embd / n_head``."""
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """Key/value heads actually used (``num_kv_heads`` or ``n_head``)."""
        return self.n_head if self.num_kv_heads is None else self.num_kv_heads
