"""Model configurations: frozen dataclasses, validated in ``__post_init__``, saved as JSON."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, TypeVar

from attnlab._checks import check_choice, check_positive_int, check_probability
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.backends import SOFTCAP_BACKENDS, check_backend
from attnlab.nn.block_layout import BlockLayout
from attnlab.nn.kinds import AttentionSpec, BigBirdSpec, FullSpec, spec_from_dict, spec_from_legacy
from attnlab.nn.kinds.base import legacy_field_names
from attnlab.nn.rope import PAIRINGS, RopeScaling

__all__ = [
    "GPTConfig",
    "TransformerConfig",
    "block_layout",
    "config_from_dict",
    "config_to_dict",
]

C = TypeVar("C")

#: the normalisations, MLP activations and model families a :class:`GPTConfig` can name
NORMS = ("layernorm", "rmsnorm", "rmsnorm_offset")
ACTIVATIONS = ("gelu_tanh", "gelu", "silu", "relu")
FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "neox", "phi3", "gemma2")


def _accepts_legacy_attention(cls: type[C]) -> type[C]:
    """Let a config's constructor take ``attention`` as a spec, a kind's name or its dict, and
    the flat attention fields of the configs written before specs existed
    (``attention="sliding", window=256``; ``bigbird_seed=3`` with a BigBird spec changes its
    seed, as ``dataclasses.replace`` does), so old code and old ``config.json`` files keep
    working. The config holds one field, ``attention``: a spec."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        names = legacy_field_names()
        legacy = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        attention = kwargs.get("attention", "full")
        if legacy or not isinstance(attention, AttentionSpec):
            if isinstance(attention, Mapping):
                attention = spec_from_dict(attention)
            if isinstance(attention, (str, AttentionSpec)):
                kwargs["attention"] = spec_from_legacy(attention, legacy)
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def _check_attention_field(config: Any, *, causal_only: bool, positions: str) -> None:
    """The config's ``attention`` as a spec (a name or a dict is converted), checked against
    the model (:meth:`~attnlab.nn.kinds.AttentionSpec.check_model`)."""
    if not isinstance(config.attention, AttentionSpec):
        object.__setattr__(config, "attention", spec_from_dict(config.attention))
    config.attention.check_model(causal_only=causal_only, positions=positions)


def block_layout(config: Any, *, causal: bool) -> BlockLayout:
    """The BigBird layout of a config with a :class:`~attnlab.nn.kinds.BigBirdSpec`, over its
    longest sequence (``n_positions`` of a GPT, ``max_len`` of the encoder-decoder):
    ``config.attention.layout(n, causal=causal)``. A call over ``T`` positions uses its crop
    to the first ``T`` (:meth:`~attnlab.nn.masks.BlockLayout.crop`).

    Args:
        config: a :class:`GPTConfig` or :class:`TransformerConfig` with BigBird attention.
        causal: the causal layout (a GPT, a decoder) or the bidirectional one (an encoder).

    Returns:
        The :class:`~attnlab.nn.masks.BlockLayout` (one per spec, length and causality).

    Raises:
        ValueError: the config's attention is not BigBird.
    """
    spec = getattr(config, "attention", None)
    if not isinstance(spec, BigBirdSpec):
        raise ArgumentError(
            f"block_layout needs a config with attention='bigbird', got "
            f"attention={getattr(spec, 'name', spec)!r}"
        )
    n = config.n_positions if isinstance(config, GPTConfig) else config.max_len
    return spec.layout(n, causal=causal)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A config (a dataclass instance) as a JSON-ready dict, with its class name under ``"kind"``.

    Args:
        config: a :class:`GPTConfig` or :class:`TransformerConfig` (any dataclass instance).

    Returns:
        ``{"kind": <class name>, <field>: <value>, ...}``; ``attention`` is its spec's dict
        (``{"kind": "sliding", "window": 256}``), left out for full attention (the default), as
        in configs saved before other kinds existed.
    """
    data = dataclasses.asdict(config)
    if isinstance(config, GPTConfig):  # GPT-2's parts: written as before families existed
        for f in dataclasses.fields(GPTConfig):
            if f.name in _PART_FIELDS and getattr(config, f.name) == f.default:
                data.pop(f.name)
        if config.rope_scaling is not None:
            data["rope_scaling"] = config.rope_scaling.to_dict()
    spec = getattr(config, "attention", None)
    if isinstance(spec, AttentionSpec):
        # a run saved with full attention compares equal when resumed, whatever the release
        if isinstance(spec, FullSpec):
            data.pop("attention")
        else:
            data["attention"] = spec.to_dict()
    return {"kind": type(config).__name__, **data}


def config_from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Rebuild a config of dataclass ``cls`` (the first argument, e.g. :class:`GPTConfig`);
    unknown keys are an error that names them.

    Args:
        data: its fields, as :func:`config_to_dict` wrote them (a ``"kind"`` key is ignored);
            the flat attention fields of configs saved before specs (``"attention": "sliding",
            "window": 256``) are read too.

    Returns:
        The validated config.

    Raises:
        ValueError: ``data`` has a key that is not a field of ``cls`` (or a value the config
            rejects).
    """
    data = {k: v for k, v in data.items() if k != "kind"}
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if "attention" in names:  # configs saved before specs: the flat attention fields
        names |= legacy_field_names()
    unknown = sorted(set(data) - names)
    if unknown:
        raise ArgumentError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
    return cls(**data)


@_accepts_legacy_attention
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
        activation: feed-forward activation, ``"relu"`` (the paper), ``"gelu"`` or ``"silu"``.
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
        family: ``"attnlab"`` (a model of its own) or the family it was read from and
            exports to (``"marian"``, :mod:`attnlab.models.families`).
        scale_embedding: multiply the embeddings by ``√d_model`` (§3.4). Default True.
        sinusoid_layout: the sinusoidal table's columns, ``"interleaved"`` (§3.5: sin, cos, sin,
            …) or ``"halves"`` (all sines, then all cosines: Marian's).
        positions: ``"sinusoidal"`` (§3.5) or ``"learned"``: one learned table each for the
            source and the target (BART's), of ``max_len + position_offset`` rows.
        position_offset: added to every position id of a learned table (BART's 2). Default 0.
        norm_embeddings: a LayerNorm over embeddings + positions, before dropout (BART's
            ``layernorm_embedding``). Default False.
        final_logits_bias: a bias added to the logits (a buffer, Marian's and BART's
            ``final_logits_bias``). Default False.
        mask_target_padding: hide ``pad_id`` target keys from the decoder (default True);
            False when the decoder starts from ``pad_id`` (Marian: ``bos_id == pad_id``).
        attention: the self-attention kind, an :class:`~attnlab.nn.kinds.AttentionSpec`
            (default :class:`~attnlab.nn.kinds.FullSpec`); cross-attention is always full.
            Encoder self-attention is the kind's bidirectional form, decoder self-attention its
            causal one: :class:`~attnlab.nn.kinds.SlidingSpec` gives the encoder the symmetric
            window ``(w, w)`` and the decoder ``(w, 0)`` with a rolling KV cache;
            :class:`~attnlab.nn.kinds.LinformerSpec` serves the encoder only (the decoder stays
            full: Linformer cannot be causal); :class:`~attnlab.nn.kinds.PerformerSpec`
            decodes from FAVOR+'s running sums; :class:`~attnlab.nn.kinds.BigBirdSpec` uses its
            layout over ``max_len`` positions. A kind's name (``"performer"``) or its dict is
            accepted, and so are the flat fields of configs saved before specs
            (``attention="sliding", window=2``).

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
    family: str = "attnlab"
    scale_embedding: bool = True
    sinusoid_layout: str = "interleaved"
    final_logits_bias: bool = False
    mask_target_padding: bool = True
    positions: str = "sinusoidal"
    position_offset: int = 0
    norm_embeddings: bool = False
    attention: AttentionSpec = dataclasses.field(default_factory=FullSpec)

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
        check_choice("activation", self.activation, ("relu", "gelu", "silu"))
        check_choice("sinusoid_layout", self.sinusoid_layout, ("interleaved", "halves"))
        check_choice("positions", self.positions, ("sinusoidal", "learned"))
        offset = self.position_offset
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ArgumentError(f"position_offset must be an int ≥ 0, got {offset!r}")
        if not isinstance(self.family, str):
            raise ArgumentTypeError(f"family must be a str, got {type(self.family).__name__}")
        check_backend(self.backend)
        for name in (
            "norm_first", "share_embeddings", "tie_output", "gradient_checkpointing",
            "scale_embedding", "final_logits_bias", "mask_target_padding", "norm_embeddings",
        ):  # fmt: skip
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
        for name in ("bos_id", "eos_id")[not self.mask_target_padding :]:
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
        _check_attention_field(self, causal_only=False, positions="sinusoidal")

    @property
    def d_head(self) -> int:
        """Head dimension ``d_model / num_heads``."""
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads actually used (``num_kv_heads`` or ``num_heads``)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


@_accepts_legacy_attention
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
        attention: the self-attention kind, an :class:`~attnlab.nn.kinds.AttentionSpec`
            (default :class:`~attnlab.nn.kinds.FullSpec`), in its causal form:
            :class:`~attnlab.nn.kinds.SlidingSpec` (each token sees itself and the ``window``
            tokens before it, Mistral's ``sliding_window``, with a rolling KV cache),
            :class:`~attnlab.nn.kinds.PerformerSpec` (causal FAVOR+ with GPT-2's
            ``c_attn``/``c_proj`` names, decoding from running sums; needs
            ``positions="learned"``), :class:`~attnlab.nn.kinds.BigBirdSpec` (causal
            block-sparse attention over ``n_positions`` tokens; a left-padded row reads the
            layout at its tokens' positions); :class:`~attnlab.nn.kinds.LinformerSpec` is
            refused (it cannot be causal). A kind's name or its dict is accepted, and so are
            the flat fields of configs saved before specs (``attention="sliding", window=256``).
            Hugging Face interop (``to_hf``) needs full attention, or a sliding window for
            Mistral.

    The parts of the block are chosen by the fields below, so that one decoder is GPT-2, Llama,
    Mistral, Qwen2 or GPT-NeoX (:mod:`attnlab.models.families` converts their Hugging Face
    configs); their defaults are GPT-2's, and a config saved with them writes none of them.

    Args:
        norm: ``"layernorm"`` (GPT-2, NeoX) or ``"rmsnorm"`` (Llama, Mistral, Qwen2), with
            ``layer_norm_epsilon``.
        activation: the MLP's nonlinearity: ``"gelu_tanh"`` (GPT-2's ``gelu_new``),
            ``"gelu"`` (exact, NeoX), ``"silu"`` (Llama) or ``"relu"``.
        mlp: ``"standard"`` (``act(x W_fc) W_proj``), ``"gated"`` (``(act(x W_gate) ⊙
            x W_fc) W_proj``, SwiGLU with ``"silu"``; Shazeer 2020), or ``"none"``: an
            attention-only model (Elhage et al. 2021; Olsson et al. 2022), whose blocks have no
            MLP and no ``ln_2``.
        d_ff: the MLP's hidden width; ``None`` means ``4 · n_embd``.
        rotary_dim: rotated dimensions of each head (``positions="rope"``); ``None`` means
            ``d_head``; fewer is GPT-NeoX's partial rotary.
        rope_pairing: ``"interleaved"`` (attnlab's own, RoFormer) or ``"halves"`` (Hugging
            Face's ``rotate_half``); see :class:`~attnlab.nn.positional.RotaryEmbedding`.
        rope_scaling: a :class:`~attnlab.nn.rope.RopeScaling` (``linear``, ``llama3``) or its
            dict, or ``None``.
        qkv_bias: biases on the query, key and value projections (Qwen2); ``None`` means ``bias``.
        proj_bias: a bias on the attention's output projection; ``None`` means ``bias``.
        mlp_bias: biases in the MLP; ``None`` means ``bias``. (``bias`` itself also gives the
            LayerNorms their biases.)
        tie_embeddings: the output projection is the token embedding (GPT-2, SmolLM2);
            ``False`` gives ``lm_head`` its own weight (Llama 2, NeoX).
        parallel_residual: ``x + Attention(LN_1(x)) + MLP(LN_2(x))`` (GPT-J, GPT-NeoX) instead
            of the sequential ``x + Attention(LN_1(x))`` then ``+ MLP(LN_2(·))``.
        full_layers: the layers (indices, ascending) that attend fully although ``attention``
            is a sliding window: Qwen2's ``layer_types`` / ``max_window_layers`` mixing
            windowed and full layers, Gemma 2's global layers. Default ``()``: every layer is
            ``attention``.
        sandwich_norm: a norm on what the attention and the MLP add to the stream as well
            (``ln_attn_out``, ``ln_mlp_out``: Gemma 2's post-attention and post-feed-forward
            norms), ``x + LN(Attention(LN_1(x)))``. Default False.
        embedding_scale: the token embedding times ``√n_embd`` (rounded to float32, then to
            the embedding's dtype, as transformers' Gemma 2 computes it).
        attn_scale: the score scale; ``None`` means ``1 / √d_head`` (Gemma 2:
            ``query_pre_attn_scalar^(−1/2)``).
        attn_softcap: ``c`` of the attention scores' soft-capping ``c · tanh(s / c)`` before
            the mask (Gemma 2's ``attn_logit_softcapping``), or ``None``; the ``math`` backend
            applies it (``auto`` picks it), the others refuse the call in one line.
        logit_softcap: ``c`` of the logits' soft-capping ``c · tanh(z / c)`` (Gemma 2's
            ``final_logit_softcapping``), or ``None``.
        family: the model family the config follows, ``"gpt2"``, ``"llama"``, ``"mistral"``,
            ``"qwen2"`` or ``"neox"``: the Hugging Face class it exports to.
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
    attention: AttentionSpec = dataclasses.field(default_factory=FullSpec)
    norm: str = "layernorm"
    activation: str = "gelu_tanh"
    mlp: str = "standard"
    d_ff: int | None = None
    rotary_dim: int | None = None
    rope_pairing: str = "interleaved"
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool | None = None
    proj_bias: bool | None = None
    mlp_bias: bool | None = None
    tie_embeddings: bool = True
    parallel_residual: bool = False
    full_layers: tuple[int, ...] = ()
    sandwich_norm: bool = False
    embedding_scale: bool = False
    attn_scale: float | None = None
    attn_softcap: float | None = None
    logit_softcap: float | None = None
    family: str = "gpt2"

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
        _check_attention_field(self, causal_only=True, positions=self.positions)
        self._check_parts()

    def _check_parts(self) -> None:
        """The family fields: choices, widths, rotary options only with ``positions="rope"``."""
        check_choice("norm", self.norm, NORMS)
        check_choice("activation", self.activation, ACTIVATIONS)
        check_choice("mlp", self.mlp, ("standard", "gated", "none"))
        check_choice("rope_pairing", self.rope_pairing, PAIRINGS)
        check_choice("family", self.family, FAMILIES)
        if self.d_ff is not None:
            check_positive_int("d_ff", self.d_ff)
        for name in ("qkv_bias", "proj_bias", "mlp_bias", "tie_embeddings", "parallel_residual",
                     "sandwich_norm", "embedding_scale"):  # fmt: skip
            value = getattr(self, name)
            if not (isinstance(value, bool) or (value is None and name.endswith("_bias"))):
                raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__}")
        if isinstance(self.rope_scaling, Mapping):
            object.__setattr__(self, "rope_scaling", RopeScaling.from_dict(self.rope_scaling))
        elif self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ArgumentTypeError(
                f"rope_scaling must be a RopeScaling, a dict or None, got "
                f"{type(self.rope_scaling).__name__}"
            )
        if self.rotary_dim is not None:
            check_positive_int("rotary_dim", self.rotary_dim)
            if self.rotary_dim % 2 or self.rotary_dim > self.d_head:
                raise ArgumentError(
                    f"rotary_dim must be even and at most d_head = {self.d_head}, got "
                    f"{self.rotary_dim}"
                )
        self._check_full_layers()
        for name in ("attn_scale", "attn_softcap", "logit_softcap"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 < value < 1e308
            ):
                raise ArgumentError(f"{name} must be a positive float or None, got {value!r}")
        if self.attn_softcap is not None and self.backend not in ("auto", *SOFTCAP_BACKENDS):
            raise ArgumentError(
                f"backend must be one of auto, {', '.join(sorted(SOFTCAP_BACKENDS))} with "
                f"attn_softcap (the others cannot soft-cap scores), got {self.backend!r}"
            )
        if self.positions != "rope":
            for name, default in (("rotary_dim", None), ("rope_scaling", None)):
                if getattr(self, name) != default:
                    raise ArgumentError(
                        f"{name} is for positions='rope', got it with positions={self.positions!r}"
                    )

    def _check_full_layers(self) -> None:
        """``full_layers``: a list or tuple of distinct ascending layer indices, only beside a
        sliding window (stored as a tuple)."""
        layers = self.full_layers
        if not isinstance(layers, (list, tuple)) or any(
            isinstance(i, bool) or not isinstance(i, int) for i in layers
        ):
            raise ArgumentTypeError(f"full_layers must be a tuple of ints, got {layers!r}")
        object.__setattr__(self, "full_layers", tuple(layers))
        if list(layers) != sorted(set(layers)) or (
            layers and not 0 <= layers[0] <= layers[-1] < self.n_layer
        ):
            raise ArgumentError(
                f"full_layers must be distinct ascending indices in [0, n_layer = "
                f"{self.n_layer}), got {tuple(layers)}"
            )
        if layers and self.attention.name != "sliding":
            raise ArgumentError(
                f"full_layers is for attention='sliding' (full layers among windowed ones), "
                f"got it with attention={self.attention.name!r}"
            )

    def attention_of(self, layer: int) -> AttentionSpec:
        """The attention of one layer: full for a layer of ``full_layers``, else ``attention``.

        Args:
            layer: the layer's index.

        Returns:
            The :class:`~attnlab.nn.kinds.AttentionSpec` its block is built with.
        """
        return FullSpec() if layer in self.full_layers else self.attention

    @property
    def d_head(self) -> int:
        """Head dimension ``n_embd / n_head``."""
        return self.n_embd // self.n_head

    @property
    def ff_width(self) -> int:
        """The MLP's hidden width: ``d_ff``, or ``4 · n_embd``."""
        return 4 * self.n_embd if self.d_ff is None else self.d_ff

    @property
    def rotary_width(self) -> int:
        """Rotated dimensions per head: ``rotary_dim``, or ``d_head``."""
        return self.d_head if self.rotary_dim is None else self.rotary_dim

    def bias_of(self, part: str) -> bool:
        """Whether a part has biases: ``"qkv"``, ``"proj"`` or ``"mlp"`` (its own field, else
        ``bias``), or ``"norm"`` (``bias``; an RMSNorm has none).

        Args:
            part: ``"qkv"``, ``"proj"``, ``"mlp"`` or ``"norm"``.

        Returns:
            Whether it has biases.
        """
        if part == "norm":
            return self.bias and self.norm == "layernorm"
        own = getattr(self, f"{part}_bias")
        return self.bias if own is None else bool(own)

    @property
    def kv_heads(self) -> int:
        """Key/value heads actually used (``num_kv_heads`` or ``n_head``)."""
        return self.n_head if self.num_kv_heads is None else self.num_kv_heads


#: the fields that choose a GPT's parts (left out of a saved config when they are GPT-2's)
_PART_FIELDS = frozenset(
    ("norm", "activation", "mlp", "d_ff", "rotary_dim", "rope_pairing", "rope_scaling",
     "qkv_bias", "proj_bias", "mlp_bias", "tie_embeddings", "parallel_residual", "full_layers",
     "sandwich_norm", "embedding_scale", "attn_scale", "attn_softcap", "logit_softcap", "family")
)  # fmt: skip
