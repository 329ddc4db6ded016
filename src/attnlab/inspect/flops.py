"""FLOPs, parameters and memory of a GPT or an encoder-decoder Transformer, term by term.

The breakdown follows the GPT-2 sizing of nanoGPT (``transformer_sizing.ipynb``): only matrix
multiplications are counted (LayerNorm, softmax, activations and residual additions are a few
percent at most), a multiply-add is 2 FLOPs, and ``A (m × k) @ B (k × n)`` costs ``2·m·k·n``.
Per layer, for ``T`` query tokens attending over ``T_k`` keys (``d = d_model``, ``H`` query heads,
``H_kv`` key/value heads, ``d_h = d / H``, ``d_ff`` the feed-forward width):

    Q/K/V projections   2 · T · d · (d + 2 · H_kv · d_h)
    QKᵀ (scores)        2 · H · T · T_k · d_h
    weights · V         2 · H · T · T_k · d_h
    output projection   2 · T · d · d
    feed-forward        2 · T · d · d_ff  +  2 · T · d_ff · d   (+ 2 · T · d · d_ff gated: SwiGLU)
    lm head             2 · T · d · vocab_size          (once, after the last layer)

Cross-attention projects the queries from the ``T`` target tokens and the keys/values from the
``S`` source tokens. A training step is forward + backward ``≈ 3 ×`` forward: every matmul's
backward computes two products of the same size (the gradient of each operand). The scores are
counted in full even under a causal mask, as the explicit ``"math"`` backend computes them (and as
:class:`torch.utils.flop_counter.FlopCounterMode` counts them).

Memory: parameters, gradients and AdamW's two moments; the KV cache
``2 · layers · B · H_kv · d_h · T · bytes`` (this is what grouped-/multi-query attention shrinks);
and the ``B · H · T · T_k`` weight matrix one layer of the explicit ``"math"`` backend holds.

**Attention kinds** (``config.attention``, an :class:`~attnlab.nn.kinds.AttentionSpec`). The core
terms are the spec's own (:meth:`~attnlab.nn.kinds.AttentionSpec.core_flops`), following its
algorithm, per head (``d_h`` the head width); for the built-in kinds:

* ``"sliding"``: ``QKᵀ`` and ``PV`` over the visible pairs only, counted exactly: a query sees
  ``min(T, w + 1)`` keys at most under the causal window ``(w, 0)`` (fewer in the first ``w``
  rows), ``2w + 1`` at most under the symmetric encoder window ``(w, w)`` (fewer at both ends);
  ``2 · pairs · d_h`` each instead of ``2 · T · T_k · d_h``. This is the pattern's **ideal**
  count: the explicit ``"math"`` backend still forms the whole ``T × T_k`` score matrix (and
  ``FlopCounterMode`` counts the full-attention figure for it), the blockwise backend skips
  whole blocks only. The KV cache is a rolling one of ``min(T, w)`` positions.
* ``"linformer"`` (encoder self-attention): the sequence projections ``E K`` and ``F V``
  (``2 · H_kv · k · T · d_h`` each, terms ``project_k``/``project_v``), then ``QK̄ᵀ`` and ``PV̄``
  over ``k`` keys: ``2 · T · k · d_h`` each. ``E`` and ``F`` (``k × max_len``) are parameters.
* ``"performer"``: the feature map ``φ`` (``2 · (T_q + T_k) · d_h · m``, term ``features``),
  then linear attention. Bidirectional: ``φ(K)ᵀV`` (``kv_state``) and ``φ(Q)(φ(K)ᵀV)``
  (``reduce``), ``2 · T · m · d_h`` each, plus the normaliser ``φ(Q)(φ(K)ᵀ1)`` (``2 · T · m``).
  Causal: the prefix sums as :func:`attnlab.nn.performer.favor_attention` runs them, chunk by
  chunk (128 queries): the running state and its products as above, plus each chunk's own
  masked ``C × C`` block (``scores`` and part of ``reduce``), counted exactly. No KV cache
  (decoding recomputes the prefix), so ``kv_cache`` is 0 for that model's self-attention.

* ``"bigbird"``: ``QKᵀ`` and ``PV`` over the **visible blocks** of the config's layout (its
  first ``T`` positions, :meth:`attnlab.nn.kinds.BigBirdSpec.layout`), ``b × b`` scores each
  (the last block partial: ``rows · cols`` counted exactly), as the blockwise backend computes
  them (``backend="auto"`` picks it under a layout): ``2 · scores · d_h`` each, with
  ``scores = Σ_visible rows(r) · cols(c)`` (:func:`block_pairs`). The causal layout's diagonal
  blocks are counted whole (the backend forms the tile, then masks its upper half). The explicit
  ``"math"`` backend still forms the whole ``T × T_k`` matrix, and a length at which the layout
  hides no block runs as full attention. The KV cache keeps every position.

These counts are what :class:`torch.utils.flop_counter.FlopCounterMode` measures for Linformer
and Performer layers and for BigBird on the blockwise backend (its tiles written out as PyTorch
matmuls: the counter has no formula for PyTorch's fused CPU attention kernel); for sliding
windows it is a hand count of the mask's visible pairs.
``memory["attention_matrix"]`` is likewise the pattern's largest per-layer attention
intermediate: ``T × T_k`` weights (full), ``T × min(T, span)`` (sliding, ideal), ``T × k``
(Linformer), the ``(T_q + T_k) × m`` feature maps (Performer), the visible blocks' scores
(BigBird, ideal), times ``B · H``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.config import GPTConfig, TransformerConfig
from attnlab.nn.kinds import AttentionSite, AttentionSpec, FullSpec, block_pairs, window_pairs

__all__ = ["FlopReport", "block_pairs", "flops", "kv_cache_bytes", "window_pairs"]

# block_pairs and window_pairs live with their kinds (attnlab.nn.kinds); they are re-exported here


@dataclass(frozen=True)
class FlopReport:
    """FLOPs, parameters and memory of one forward pass / training step.

    Attributes:
        model: ``"gpt"`` or ``"transformer"``.
        seq_len: tokens per sequence (the target length for the encoder-decoder).
        src_len: source tokens (encoder-decoder), else ``None``.
        batch: sequences per batch.
        forward: FLOPs of one forward pass per term, all layers and the batch included, keyed
            ``"<part>/<term>"`` (e.g. ``"attention/qkv"``, ``"decoder/cross_attention/scores"``).
        params: parameter counts per part (tied weights counted once), ``"total"`` included.
        memory: bytes: ``"parameters"``, ``"gradients"``, ``"adam_state"``, ``"training_state"``
            (their sum), ``"kv_cache"`` and ``"attention_matrix"`` (one layer's weights, math path,
            or the largest attention intermediate of the config's pattern: see the module's
            docstring).
        kv_cache: KV-cache bytes at this length for multi-head (``"MHA"``), the config's grouped
            heads (``"GQA"``, when it uses them) and multi-query (``"MQA"``) attention.
        kv_heads: ``{"MHA": H, "GQA": H_kv, "MQA": 1}`` — the key/value heads of each entry above.
        dtype_bytes: bytes per element used for parameters, KV cache and activations.
    """

    model: str
    seq_len: int
    src_len: int | None
    batch: int
    forward: dict[str, int]
    params: dict[str, int]
    memory: dict[str, int]
    kv_cache: dict[str, int]
    kv_heads: dict[str, int] = field(default_factory=dict)
    dtype_bytes: int = 4

    @property
    def forward_total(self) -> int:
        """FLOPs of one forward pass."""
        return sum(self.forward.values())

    @property
    def backward_total(self) -> int:
        """FLOPs of the backward pass: ``2 ×`` forward (both operands' gradients)."""
        return 2 * self.forward_total

    @property
    def train_total(self) -> int:
        """FLOPs of one training step (forward + backward): ``3 ×`` forward."""
        return self.forward_total + self.backward_total

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs per (target) token."""
        return self.forward_total / (self.batch * self.seq_len)

    def grouped(self) -> dict[str, int]:
        """Forward FLOPs summed per kind of term.

        Returns:
            Kind (the last part of a term's name: ``"qkv"``, ``"scores"``, ``"ffn"`` …) → FLOPs.
        """
        out: dict[str, int] = {}
        for key, value in self.forward.items():
            kind = key.rsplit("/", 1)[-1]
            out[kind] = out.get(kind, 0) + value
        return out

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data, for JSON.

        Returns:
            The fields by name, with the forward and training totals added.
        """
        return {
            "model": self.model,
            "seq_len": self.seq_len,
            "src_len": self.src_len,
            "batch": self.batch,
            "forward": dict(self.forward),
            "forward_total": self.forward_total,
            "backward_total": self.backward_total,
            "train_total": self.train_total,
            "params": dict(self.params),
            "memory": dict(self.memory),
            "kv_cache": dict(self.kv_cache),
            "kv_heads": dict(self.kv_heads),
            "dtype_bytes": self.dtype_bytes,
        }


# -- the terms ------------------------------------------------------------------------------


def _attention_terms(
    prefix: str,
    t_q: int,
    t_k: int,
    d: int,
    h: int,
    h_kv: int,
    *,
    cross: bool = False,
    pattern: tuple[AttentionSpec, AttentionSite] | None = None,
) -> dict[str, int]:
    """Forward FLOPs of one attention layer for one sequence; the core's terms are the spec's
    (:meth:`~attnlab.nn.kinds.AttentionSpec.core_flops`), full attention without one."""
    d_h = d // h
    kv = h_kv * d_h
    terms: dict[str, int] = {}
    if cross:
        terms[f"{prefix}/q"] = 2 * t_q * d * d  # Q = x W^Q, from the target
        terms[f"{prefix}/kv"] = 2 * t_k * d * 2 * kv  # K, V = m W^K, m W^V, from the source
    else:
        terms[f"{prefix}/qkv"] = 2 * t_q * d * (d + 2 * kv)  # [Q K V] = x [W^Q W^K W^V]
    spec, site = pattern if pattern is not None else (_FULL, AttentionSite(d, h))
    core = spec.core_flops(t_q, t_k, d_head=d_h, heads=h, kv_heads=h_kv, site=site)
    terms.update({f"{prefix}/{name}": n for name, n in core.items()})
    terms[f"{prefix}/proj"] = 2 * t_q * d * d  # O W^O
    return terms


_FULL = FullSpec()


def _patterns(config: Any) -> dict[str, tuple[AttentionSpec, AttentionSite]]:
    """The spec in force and the site of each self-attention role (``"gpt"``, ``"encoder"``,
    ``"decoder"``)."""
    spec: AttentionSpec = config.attention
    if isinstance(config, GPTConfig):
        d, h, h_kv, n = config.n_embd, config.n_head, config.num_kv_heads, config.n_positions
    else:
        d, h, h_kv, n = config.d_model, config.num_heads, config.num_kv_heads, config.max_len
    out = {}
    for role, causal in (("gpt", True), ("encoder", False), ("decoder", True)):
        site = AttentionSite(d, h, num_kv_heads=h_kv, causal=causal, max_len=n)
        out[role] = (spec.at(causal=causal), site)
    return out


def _matrix_elements(t_q: int, t_k: int, pattern: tuple[AttentionSpec, AttentionSite]) -> int:
    """Elements per head of the largest attention intermediate of one layer."""
    spec, site = pattern
    return spec.matrix_elements(t_q, t_k, d_head=site.d_head, site=site)


def _ffn_terms(prefix: str, t: int, d: int, d_ff: int, gated: bool = False) -> dict[str, int]:
    terms = {f"{prefix}/ffw1": 2 * t * d * d_ff, f"{prefix}/ffw2": 2 * t * d_ff * d}
    if gated:  # act(x W_gate) ⊙ x W_fc: one more d × d_ff matmul
        terms[f"{prefix}/gate"] = 2 * t * d * d_ff
    return terms


def _scaled(terms: dict[str, int], factor: int) -> dict[str, int]:
    return {k: v * factor for k, v in terms.items()}


def _add(total: dict[str, int], terms: dict[str, int]) -> None:
    for k, v in terms.items():
        total[k] = total.get(k, 0) + v


def _attn_params(d: int, h: int, h_kv: int, bias: bool, proj_bias: bool | None = None) -> int:
    kv = h_kv * (d // h)
    proj_bias = bias if proj_bias is None else proj_bias
    return d * (d + 2 * kv) + d * d + (d + 2 * kv if bias else 0) + (d if proj_bias else 0)


def _ffn_params(d: int, d_ff: int, bias: bool, gated: bool = False) -> int:
    matrices = 3 if gated else 2
    return matrices * d * d_ff + ((matrices - 1) * d_ff + d if bias else 0)


def _ln_params(d: int, bias: bool) -> int:
    return 2 * d if bias else d


# -- public ---------------------------------------------------------------------------------


def kv_cache_bytes(
    config: GPTConfig | TransformerConfig,
    seq_len: int,
    batch: int = 1,
    *,
    num_kv_heads: int | None = None,
    src_len: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> int:
    """Bytes of the KV cache after ``seq_len`` tokens:

        2 (K and V) · layers · B · H_kv · d_h · T · bytes per element

    For the encoder-decoder each decoder layer holds its self-attention cache (``seq_len`` target
    tokens) and its cross-attention keys/values (``src_len`` source tokens, default ``seq_len``).
    With ``config.attention == "sliding"`` the self-attention cache is a rolling one of
    ``min(seq_len, window)`` positions (but in a GPT's ``full_layers``, which keep every one); with ``"performer"`` each layer keeps its running sums
    (:class:`~attnlab.nn.kv_cache.PerformerState`: ``H_kv · (m · (d_h + 1) + 1)`` numbers per
    sequence in at least float32), the same for any ``seq_len``; ``"bigbird"`` keeps every
    position.

    Args:
        config: a :class:`~attnlab.GPTConfig` or :class:`~attnlab.TransformerConfig`.
        seq_len: cached tokens ``T``; at most the model's positions (``config.n_positions`` of
            a GPT, ``config.max_len`` of the encoder-decoder).
        batch: sequences ``B``. Default 1.
        num_kv_heads: key/value heads ``H_kv``; default the config's (``H`` for MHA, ``1`` is MQA).
        src_len: source tokens (encoder-decoder only; at most ``config.max_len``); default
            ``seq_len``.
        dtype: cache dtype. Default ``torch.float32``.

    Returns:
        The size in bytes.
    """
    geo = _geometry(config, num_kv_heads)
    _check_length(geo, "seq_len", seq_len)
    check_positive_int("batch", batch)
    h_kv, d_h = geo["kv_heads"], geo["d"] // geo["h"]
    spec, _ = _patterns(config)["decoder"]  # the causal self-attention's cache (GPT: the same)
    layers = geo["layers_dec"]
    own = spec.cache_bytes(seq_len, batch=batch, kv_heads=h_kv, d_head=d_h, dtype=dtype)
    full = len(getattr(config, "full_layers", ()))  # full layers among windowed ones (Qwen2)
    if full:
        whole = _FULL.cache_bytes(seq_len, batch=batch, kv_heads=h_kv, d_head=d_h, dtype=dtype)
        return (layers - full) * own + full * whole
    cross = 0
    if geo["kind"] == "transformer":
        s = seq_len if src_len is None else _check_length(geo, "src_len", src_len)
        cross = _FULL.cache_bytes(s, batch=batch, kv_heads=h_kv, d_head=d_h, dtype=dtype)
    return layers * (own + cross)


def flops(
    config: GPTConfig | TransformerConfig,
    seq_len: int,
    batch: int = 1,
    *,
    src_len: int | None = None,
    num_kv_heads: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> FlopReport:
    """FLOPs and memory of a forward pass and a training step, term by term.

    Args:
        config: a :class:`~attnlab.GPTConfig` or :class:`~attnlab.TransformerConfig`.
        seq_len: tokens per sequence ``T`` (the target length for the encoder-decoder); at most
            the longest sequence the model holds, ``config.n_positions`` of a GPT (whatever its
            ``positions``) or ``config.max_len`` of the encoder-decoder.
        batch: sequences ``B``. Default 1.
        src_len: source length ``S`` of the encoder-decoder (at most ``config.max_len``);
            default ``seq_len``.
        num_kv_heads: override the config's key/value heads (to compare MHA / GQA / MQA).
        dtype: element type of parameters, cache and activations, for the byte counts.
            Default ``torch.float32``.

    Returns:
        A :class:`FlopReport`; ``report.forward_total``, ``report.train_total`` (``3 ×`` forward)
        and ``report.forward`` for the terms.

    Raises:
        TypeError: ``config`` or ``dtype`` is of another type.
        ValueError: a length or ``batch`` is not a positive int, a length is longer than the
            model holds, ``num_kv_heads`` does not divide the heads, or ``src_len`` is given
            for a GPT.

    Examples:
        >>> from attnlab import GPTConfig
        >>> r = flops(GPTConfig(), seq_len=1024)
        >>> round(r.forward_total / 1e9)   # GPT-2 small, one 1024-token sequence
        292
    """
    geo = _geometry(config, num_kv_heads)
    _check_length(geo, "seq_len", seq_len)
    check_positive_int("batch", batch)
    if src_len is not None:
        check_positive_int("src_len", src_len)
        if geo["kind"] != "transformer":
            raise ArgumentError(
                "src_len is only for the encoder-decoder (TransformerConfig), got a GPTConfig"
            )
        _check_length(geo, "src_len", src_len)
    d, h, h_kv, d_ff = geo["d"], geo["h"], geo["kv_heads"], geo["d_ff"]
    pats = _patterns(config)
    nbytes = _dtype_bytes(dtype)
    fwd: dict[str, int] = {}
    params: dict[str, int] = {}
    t = seq_len
    if geo["kind"] == "gpt":
        cfg: Any = config
        layers, full = cfg.n_layer, len(cfg.full_layers)  # full layers beside windowed ones
        _add(
            fwd,
            _scaled(
                _attention_terms("attention", t, t, d, h, h_kv, pattern=pats["gpt"]), layers - full
            ),
        )
        if full:
            whole = (_FULL, pats["gpt"][1])
            _add(fwd, _scaled(_attention_terms("attention", t, t, d, h, h_kv, pattern=whole), full))
        gated = cfg.mlp == "gated"
        if cfg.mlp != "none":  # an attention-only model has no MLP
            _add(fwd, _scaled(_ffn_terms("mlp", t, d, d_ff, gated), layers))
        fwd["lm_head"] = 2 * t * d * cfg.vocab_size
        params["embedding/token"] = cfg.vocab_size * d
        if cfg.positions == "learned":
            params["embedding/position"] = cfg.n_positions * d
        own = pats["gpt"][0].extra_parameters(pats["gpt"][1])  # a kind's own parameters
        norm = _ln_params(d, cfg.bias_of("norm"))  # an RMSNorm: its gain only
        qkv, proj = cfg.bias_of("qkv"), cfg.bias_of("proj")
        params["attention"] = layers * (_attn_params(d, h, h_kv, qkv, proj) + own + norm)
        if cfg.mlp != "none":
            params["mlp"] = layers * (_ffn_params(d, d_ff, cfg.bias_of("mlp"), gated) + norm)
        params["ln_f"] = norm
        # tied to the token embedding, or a matrix of its own
        params["lm_head"] = 0 if cfg.tie_embeddings else cfg.vocab_size * d
        attn_matrix = batch * h * _matrix_elements(t, t, pats["gpt"]) * nbytes
    else:
        cfg = config
        s = seq_len if src_len is None else src_len
        n_enc, n_dec = cfg.num_encoder_layers, cfg.num_decoder_layers
        enc_terms = _attention_terms("encoder/attention", s, s, d, h, h_kv, pattern=pats["encoder"])
        _add(fwd, _scaled(enc_terms, n_enc))
        _add(fwd, _scaled(_ffn_terms("encoder/mlp", s, d, d_ff), n_enc))
        dec_terms = _attention_terms(
            "decoder/self_attention", t, t, d, h, h_kv, pattern=pats["decoder"]
        )
        _add(fwd, _scaled(dec_terms, n_dec))
        _add(
            fwd,
            _scaled(
                _attention_terms("decoder/cross_attention", t, s, d, h, h_kv, cross=True), n_dec
            ),
        )
        _add(fwd, _scaled(_ffn_terms("decoder/mlp", t, d, d_ff), n_dec))
        fwd["lm_head"] = 2 * t * d * cfg.tgt_vocab_size
        params["embedding/source"] = cfg.src_vocab_size * d
        params["embedding/target"] = 0 if cfg.share_embeddings else cfg.tgt_vocab_size * d
        attn, ffn, ln = (
            _attn_params(d, h, h_kv, True),
            _ffn_params(d, d_ff, True),
            _ln_params(d, True),
        )
        final_ln = ln if cfg.norm_first else 0
        enc_spec, enc_site = pats["encoder"]
        attn_enc = attn + enc_spec.extra_parameters(enc_site)  # Linformer's E and F
        params["encoder"] = n_enc * (attn_enc + ffn + 2 * ln) + final_ln
        attn_dec = attn + pats["decoder"][0].extra_parameters(pats["decoder"][1])
        params["decoder"] = n_dec * (attn_dec + attn + ffn + 3 * ln) + final_ln
        params["lm_head"] = 0 if cfg.tie_output else cfg.tgt_vocab_size * d
        elements = max(
            _matrix_elements(s, s, pats["encoder"]),
            _matrix_elements(t, t, pats["decoder"]),
            t * s,  # cross-attention is full
        )
        attn_matrix = batch * h * elements * nbytes
    fwd = {k: v * batch for k, v in fwd.items()}
    params["total"] = sum(params.values())

    kv: dict[str, int] = {}
    kv_heads: dict[str, int] = {}
    options = [("MHA", h)] + ([("GQA", h_kv)] if 1 < h_kv < h else []) + [("MQA", 1)]
    for name, n in options:
        kv[name] = kv_cache_bytes(
            config, seq_len, batch, num_kv_heads=n, src_len=src_len, dtype=dtype
        )
        kv_heads[name] = n
    param_bytes = params["total"] * nbytes
    memory = {
        "parameters": param_bytes,
        "gradients": param_bytes,
        "adam_state": 2 * params["total"] * 4,  # two fp32 moments per parameter
    }
    memory["training_state"] = sum(memory.values())
    memory["kv_cache"] = kv_cache_bytes(
        config, seq_len, batch, num_kv_heads=h_kv, src_len=src_len, dtype=dtype
    )
    memory["attention_matrix"] = attn_matrix
    return FlopReport(
        model=geo["kind"],
        seq_len=seq_len,
        src_len=(seq_len if src_len is None else src_len) if geo["kind"] == "transformer" else None,
        batch=batch,
        forward=fwd,
        params=params,
        memory=memory,
        kv_cache=kv,
        kv_heads=kv_heads,
        dtype_bytes=nbytes,
    )


def _geometry(config: object, num_kv_heads: int | None) -> dict[str, Any]:
    """The sizes the formulas need, from either config."""
    geo: dict[str, Any]
    if isinstance(config, GPTConfig):
        geo = {
            "kind": "gpt", "d": config.n_embd, "h": config.n_head, "kv_heads": config.kv_heads,
            "d_ff": config.ff_width, "bias": config.bias, "layers_dec": config.n_layer,
            "max_len": config.n_positions, "max_len_name": "config.n_positions",
        }  # fmt: skip
    elif isinstance(config, TransformerConfig):
        geo = {
            "kind": "transformer", "d": config.d_model, "h": config.num_heads,
            "kv_heads": config.kv_heads, "d_ff": config.d_ff, "bias": True,
            "layers_dec": config.num_decoder_layers,
            "max_len": config.max_len, "max_len_name": "config.max_len",
        }  # fmt: skip
    else:
        raise ArgumentTypeError(
            f"config must be a GPTConfig or a TransformerConfig, got {type(config).__name__}"
        )
    if num_kv_heads is not None:
        check_positive_int("num_kv_heads", num_kv_heads)
        if geo["h"] % num_kv_heads != 0:
            raise ArgumentError(
                f"num_kv_heads must divide the {geo['h']} query heads, got {num_kv_heads}"
            )
        geo["kv_heads"] = num_kv_heads
    return geo


def _check_length(geo: dict[str, Any], name: str, value: int) -> int:
    """``value`` (a checked positive length) when the model can hold it: at most its positions."""
    check_positive_int(name, value)
    if value > geo["max_len"]:
        raise ArgumentError(
            f"{name} must be at most {geo['max_len_name']} = {geo['max_len']} (the longest "
            f"sequence the model holds), got {value}"
        )
    return value


def _dtype_bytes(dtype: object) -> int:
    if not isinstance(dtype, torch.dtype):
        raise ArgumentTypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    return torch.empty((), dtype=dtype).element_size()
