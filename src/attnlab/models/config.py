"""Model configurations: frozen dataclasses, validated in ``__post_init__``, saved as JSON."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any, TypeVar

from attnlab._checks import check_choice, check_positive_int, check_probability
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.backends import check_backend
from attnlab.nn.block_layout import BlockLayout, bigbird_layout

__all__ = [
    "ATTENTIONS",
    "ATTENTION_FIELDS",
    "BIGBIRD_DEFAULTS",
    "BIGBIRD_FIELDS",
    "GPTConfig",
    "TransformerConfig",
    "block_layout",
    "check_attention",
    "config_from_dict",
    "config_to_dict",
]

C = TypeVar("C")

#: the attention patterns a model config can choose (``attention=``)
ATTENTIONS: tuple[str, ...] = ("full", "sliding", "linformer", "performer", "bigbird")

#: the config fields that belong to ``attention`` and its parameters (left out of a saved
#: config with full attention, as in configs saved before they existed)
ATTENTION_FIELDS: tuple[str, ...] = (
    "attention", "window", "linformer_k", "num_features", "block_size", "global_blocks",
    "window_blocks", "num_random_blocks", "bigbird_seed",
)  # fmt: skip

#: BigBird's parameters among :data:`ATTENTION_FIELDS`
BIGBIRD_FIELDS: tuple[str, ...] = ATTENTION_FIELDS[4:]

#: what ``attention="bigbird"`` takes for a parameter left ``None``: the defaults of
#: :func:`attnlab.masks.bigbird_layout` (``bigbird_seed`` is its ``seed``)
BIGBIRD_DEFAULTS: dict[str, int] = {
    "global_blocks": 1,
    "window_blocks": 3,
    "num_random_blocks": 2,
    "bigbird_seed": 0,
}

# each attention's parameters, ``None`` when not chosen: (owner, required)
_OWNERS: dict[str, tuple[str, bool]] = {
    "window": ("sliding", True),
    "linformer_k": ("linformer", True),
    "num_features": ("performer", False),
    "block_size": ("bigbird", True),
    "global_blocks": ("bigbird", False),
    "window_blocks": ("bigbird", False),
    "num_random_blocks": ("bigbird", False),
    "bigbird_seed": ("bigbird", False),
}
# the parameters that may be 0 (the others must be positive)
_MAY_BE_ZERO = ("global_blocks", "window_blocks", "num_random_blocks", "bigbird_seed")


def check_attention(
    attention: object,
    window: object,
    linformer_k: object,
    num_features: object,
    *,
    causal_only: bool,
    block_size: object = None,
    global_blocks: object = None,
    window_blocks: object = None,
    num_random_blocks: object = None,
    bigbird_seed: object = None,
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
        block_size: BigBird's block ``b`` (``attention="bigbird"`` only, required there).
        global_blocks: BigBird's global blocks, the first ``g`` (``"bigbird"`` only, ``>= 0``).
        window_blocks: BigBird's band width in blocks (``"bigbird"`` only; 0 or odd).
        num_random_blocks: BigBird's random key blocks per query block (``"bigbird"`` only,
            ``>= 0``).
        bigbird_seed: the seed of BigBird's random blocks (``"bigbird"`` only, ``>= 0``).

    Raises:
        ValueError: an unknown attention name, a parameter for another attention, a missing
            or out-of-range parameter (an even ``window_blocks``; a BigBird layout without
            global, band or random blocks), or Linformer in a causal-only model.
        TypeError: a parameter that is not an int.
    """
    check_choice("attention", attention, ATTENTIONS)
    params = {"window": window, "linformer_k": linformer_k, "num_features": num_features,
              "block_size": block_size, "global_blocks": global_blocks,
              "window_blocks": window_blocks, "num_random_blocks": num_random_blocks,
              "bigbird_seed": bigbird_seed}  # fmt: skip
    for name, value in params.items():
        owner, required = _OWNERS[name]
        if value is None:
            if attention == owner and required:
                raise ArgumentError(f"attention={owner!r} needs {name} (a positive int), got None")
            continue
        if attention != owner:
            raise ArgumentError(
                f"{name} applies to attention={owner!r} only, got {name}={value!r} with "
                f"attention={attention!r}"
            )
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
        if name not in _MAY_BE_ZERO:
            check_positive_int(name, value)
        elif value < 0:
            raise ArgumentError(f"{name} must be >= 0, got {value}")
    if attention == "bigbird":
        _check_bigbird(global_blocks, window_blocks, num_random_blocks)
    if causal_only and attention == "linformer":
        raise ArgumentError(
            "attention='linformer' is not available for GPTConfig: Linformer projects the keys "
            "along the sequence, so every projected key mixes future positions and the method "
            "cannot be causal; use 'sliding' or 'performer' (or linformer in a TransformerConfig "
            "encoder)"
        )


def _check_bigbird(global_blocks: object, window_blocks: object, num_random: object) -> None:
    """BigBird's layout needs an odd band (or none) and some visible block besides."""
    band = BIGBIRD_DEFAULTS["window_blocks"] if window_blocks is None else window_blocks
    if band != 0 and band % 2 == 0:  # type: ignore[operator]
        raise ArgumentError(
            f"window_blocks must be 0 or odd (a block and (w - 1) / 2 neighbours each side), "
            f"got {band}"
        )
    if global_blocks == 0 and band == 0 and num_random == 0:
        raise ArgumentError(
            "attention='bigbird' needs some visible blocks: global_blocks, window_blocks and "
            "num_random_blocks are all 0, so every key would be hidden"
        )


def _resolve_bigbird(config: Any) -> None:
    """Fill a BigBird config's parameters left ``None`` with :data:`BIGBIRD_DEFAULTS`, in place
    (a frozen dataclass's ``__post_init__``), so that the saved config names every number the
    layout is drawn from."""
    if config.attention != "bigbird":
        return
    for name, value in BIGBIRD_DEFAULTS.items():
        if getattr(config, name) is None:
            object.__setattr__(config, name, value)


@lru_cache(maxsize=64)
def block_layout(config: Any, *, causal: bool) -> BlockLayout:
    """The BigBird layout of a config with ``attention="bigbird"``, over its longest sequence.

    ``bigbird_layout(n, block_size=…, global_blocks=…, window_blocks=…, num_random_blocks=…,
    seed=bigbird_seed, causal=causal)`` with ``n`` the config's positions (``n_positions`` of a
    GPT, ``max_len`` of the encoder-decoder): a call over ``T`` positions uses its crop to the
    first ``T`` (:meth:`~attnlab.nn.masks.BlockLayout.crop`). The seed is in the config, so a
    saved model rebuilds the same layout; one layout is built per config and kind and shared
    by the layers (it is immutable).

    Args:
        config: a :class:`GPTConfig` or :class:`TransformerConfig` with ``attention="bigbird"``.
        causal: the causal layout (a GPT, a decoder) or the bidirectional one (an encoder).

    Returns:
        The :class:`~attnlab.nn.masks.BlockLayout`.

    Raises:
        ValueError: the config's attention is not ``"bigbird"``.
    """
    if getattr(config, "attention", None) != "bigbird":
        raise ArgumentError(
            f"block_layout needs a config with attention='bigbird', got "
            f"attention={getattr(config, 'attention', None)!r}"
        )
    n = config.n_positions if isinstance(config, GPTConfig) else config.max_len
    return bigbird_layout(
        n,
        block_size=config.block_size,
        global_blocks=config.global_blocks,
        window_blocks=config.window_blocks,
        num_random_blocks=config.num_random_blocks,
        seed=config.bigbird_seed,
        causal=causal,
    )


def config_to_dict(config: Any) -> dict[str, Any]:
    """A config (a dataclass instance) as a JSON-ready dict, with its class name under ``"kind"``.

    Args:
        config: a :class:`GPTConfig` or :class:`TransformerConfig` (any dataclass instance).

    Returns:
        ``{"kind": <class name>, <field>: <value>, ...}``; with full attention (the default)
        the attention fields (:data:`ATTENTION_FIELDS`: ``attention``, ``window``,
        ``linformer_k``, ``num_features`` and BigBird's) are left out, as in configs saved
        before they existed; with another attention than BigBird, BigBird's fields (``None``)
        are left out, as in configs saved before BigBird was offered.
    """
    data = dataclasses.asdict(config)
    if "attention" in data:
        # fields are left out as they were before they existed: a run saved then compares
        # equal when resumed, and config_from_dict fills them in (None)
        attention = data["attention"]
        gone = ATTENTION_FIELDS if attention == "full" else BIGBIRD_FIELDS
        for name in gone:
            if name in data and (attention != "bigbird" or data[name] is None):
                data.pop(name)
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
        raise ArgumentError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
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
              causal FAVOR+ (:class:`~attnlab.nn.performer.PerformerAttention`). The decoder's
              self-attention keeps FAVOR+'s running sums
              (:class:`~attnlab.nn.kv_cache.PerformerState`) instead of a KV cache, so a
              decoding step costs the same whatever the target prefix.
            * ``"bigbird"``: block-sparse attention (Zaheer et al. 2020): blocks of
              ``block_size`` positions, of which the first ``global_blocks`` are global (they
              see and are seen by every block), a band of ``window_blocks`` blocks and
              ``num_random_blocks`` random key blocks per query block, drawn from
              ``bigbird_seed`` (:func:`attnlab.masks.bigbird_layout` over ``max_len``
              positions, see :func:`block_layout`). Encoder self-attention uses the
              bidirectional layout, decoder self-attention the causal one (blocks on or below
              the diagonal, future keys hidden), with a full KV cache while decoding. A
              sequence of ``T`` positions uses the layout's first ``T`` (its top-left crop), so
              a position sees the same blocks whatever the length. ``backend="auto"`` runs the
              blockwise backend, which visits only the visible blocks.
        window: the sliding window ``w`` (``attention="sliding"`` only, required there).
        linformer_k: Linformer's projected length ``k`` (``attention="linformer"`` only,
            required there).
        num_features: Performer's random features ``m`` (``attention="performer"`` only);
            ``None`` (default) takes ``round(d_head · ln d_head)``.
        block_size: BigBird's block ``b`` in positions (``attention="bigbird"`` only, required
            there; not a context length).
        global_blocks: BigBird's global blocks, the first ``g`` (``attention="bigbird"`` only;
            ``None`` takes 1).
        window_blocks: BigBird's band width in blocks, 0 or odd (``attention="bigbird"`` only;
            ``None`` takes 3: a block and its two neighbours).
        num_random_blocks: BigBird's random key blocks per query block, ``>= 0``
            (``attention="bigbird"`` only; ``None`` takes 2).
        bigbird_seed: the seed the random blocks are drawn from, ``>= 0`` (``attention="bigbird"``
            only; ``None`` takes 0). With ``attention="bigbird"`` the ``None`` parameters are
            set to these defaults (:data:`BIGBIRD_DEFAULTS`), so a saved config names them.

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
    block_size: int | None = None
    global_blocks: int | None = None
    window_blocks: int | None = None
    num_random_blocks: int | None = None
    bigbird_seed: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "num_encoder_layers",
            "num_decoder_layers", "d_ff", "max_len",
        ):  # fmt: skip
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.num_heads != 0:
            raise ArgumentError(
                f"d_model = {self.d_model} must be divisible by num_heads = {self.num_heads}"
            )
        if self.num_kv_heads is not None:
            check_positive_int("num_kv_heads", self.num_kv_heads)
            if self.num_heads % self.num_kv_heads != 0:
                raise ArgumentError(
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
                raise ArgumentTypeError(
                    f"{name} must be a bool, got {type(getattr(self, name)).__name__}"
                )
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps <= 0:
            raise ArgumentError(f"layer_norm_eps must be a positive float, got {eps!r}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
            if not 0 <= value < self.tgt_vocab_size:
                raise ArgumentError(
                    f"{name} must lie in [0, tgt_vocab_size = {self.tgt_vocab_size}), got {value}"
                )
        if self.pad_id >= self.src_vocab_size:
            raise ArgumentError(
                f"pad_id must lie in [0, src_vocab_size = {self.src_vocab_size}), got {self.pad_id}"
            )
        for name in ("bos_id", "eos_id"):
            if getattr(self, name) == self.pad_id:
                raise ArgumentError(
                    f"{name} must differ from pad_id (padding is masked and ignored by the loss), "
                    f"got {name} = pad_id = {self.pad_id}"
                )
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ArgumentError(
                f"share_embeddings=True needs src_vocab_size == tgt_vocab_size, got "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}"
            )
        check_attention(
            self.attention, self.window, self.linformer_k, self.num_features, causal_only=False,
            **{name: getattr(self, name) for name in BIGBIRD_FIELDS},
        )  # fmt: skip
        _resolve_bigbird(self)

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
        attention: the self-attention pattern, one of ``"full"`` (default), ``"sliding"``,
            ``"performer"`` and ``"bigbird"`` (:data:`ATTENTIONS`; ``"linformer"`` is refused:
            it cannot be causal).

            * ``"sliding"``: each token sees itself and the ``window`` tokens before it (the
              causal window ``(window, 0)``, Mistral's ``sliding_window``); decoding keeps a
              rolling KV cache of ``window`` positions.
            * ``"performer"``: causal FAVOR+ (:class:`~attnlab.nn.performer.PerformerAttention`,
              Choromanski et al. 2021) with GPT-2's ``c_attn``/``c_proj`` names. Needs
              ``positions="learned"`` (the layer applies neither rotary embeddings nor the
              additive ALiBi bias). It has no KV cache: :meth:`GPT.new_cache` gives one
              :class:`~attnlab.nn.kv_cache.PerformerState` per layer (FAVOR+'s running sums), so
              each decoding step costs the same whatever the prefix.
            * ``"bigbird"``: causal block-sparse attention (Zaheer et al. 2020): blocks of
              ``block_size`` tokens; the first ``global_blocks`` are global (every later token
              sees them, and they see the past), each block sees a band of ``window_blocks``
              blocks and ``num_random_blocks`` random earlier blocks drawn from
              ``bigbird_seed``, only on or below the diagonal and with future tokens hidden
              (:func:`attnlab.masks.bigbird_layout` over ``n_positions`` tokens, ``causal=True``,
              see :func:`block_layout`). A sequence of ``T`` tokens uses the layout's first
              ``T`` (its top-left crop), so a token sees the same keys whatever the length and
              decoding with the (full) KV cache gives the logits of the full forward; a left-padded
              row (``attention_mask``) reads the layout at its tokens' positions, as an unpadded
              row would. ``backend="auto"`` runs the blockwise backend, which visits only the
              visible blocks.

            Hugging Face interop (``to_hf``) needs ``"full"``.
        window: the sliding window ``w`` (``attention="sliding"`` only, required there).
        linformer_k: accepted for symmetry with :class:`TransformerConfig`; must be ``None``.
        num_features: Performer's random features ``m`` (``attention="performer"`` only);
            ``None`` (default) takes ``round(d_head · ln d_head)``.
        block_size: BigBird's block ``b`` in tokens (``attention="bigbird"`` only, required
            there; not the context length, which is ``n_positions``).
        global_blocks: BigBird's global blocks, the first ``g`` (``attention="bigbird"`` only;
            ``None`` takes 1).
        window_blocks: BigBird's band width in blocks, 0 or odd (``attention="bigbird"`` only;
            ``None`` takes 3: a block and its two neighbours, the later one hidden by the
            causal rule).
        num_random_blocks: BigBird's random key blocks per query block, ``>= 0``
            (``attention="bigbird"`` only; ``None`` takes 2).
        bigbird_seed: the seed the random blocks are drawn from, ``>= 0`` (``attention="bigbird"``
            only; ``None`` takes 0). With ``attention="bigbird"`` the ``None`` parameters are
            set to these defaults (:data:`BIGBIRD_DEFAULTS`), so a saved config names them.
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
    block_size: int | None = None
    global_blocks: int | None = None
    window_blocks: int | None = None
    num_random_blocks: int | None = None
    bigbird_seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            check_positive_int(name, getattr(self, name))
        if self.n_embd % self.n_head != 0:
            raise ArgumentError(
                f"n_embd = {self.n_embd} must be divisible by n_head = {self.n_head}"
            )
        if self.num_kv_heads is not None:
            check_positive_int("num_kv_heads", self.num_kv_heads)
            if self.n_head % self.num_kv_heads != 0:
                raise ArgumentError(
                    f"n_head = {self.n_head} must be a multiple of num_kv_heads = {self.num_kv_heads}"
                )
        check_choice("positions", self.positions, ("learned", "rope", "alibi"))
        if self.positions == "rope" and (self.n_embd // self.n_head) % 2:
            raise ArgumentError(
                f"positions='rope' needs an even head dimension n_embd / n_head, "
                f"got {self.n_embd} / {self.n_head} = {self.n_embd // self.n_head}"
            )
        check_probability("dropout", self.dropout)
        for name in ("gradient_checkpointing", "bias"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentTypeError(
                    f"{name} must be a bool, got {type(getattr(self, name)).__name__}"
                )
        for name in ("layer_norm_epsilon", "rope_base"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ArgumentError(f"{name} must be a positive float, got {value!r}")
        check_backend(self.backend)
        check_attention(
            self.attention, self.window, self.linformer_k, self.num_features, causal_only=True,
            **{name: getattr(self, name) for name in BIGBIRD_FIELDS},
        )  # fmt: skip
        _resolve_bigbird(self)
        if self.attention == "performer" and self.positions != "learned":
            raise ArgumentError(
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
