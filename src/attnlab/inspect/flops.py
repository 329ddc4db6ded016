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
    feed-forward        2 · T · d · d_ff  +  2 · T · d_ff · d
    lm head             2 · T · d · vocab_size          (once, after the last layer)

Cross-attention projects the queries from the ``T`` target tokens and the keys/values from the
``S`` source tokens. A training step is forward + backward ``≈ 3 ×`` forward: every matmul's
backward computes two products of the same size (the gradient of each operand). The scores are
counted in full even under a causal mask, as the explicit ``"math"`` backend computes them (and as
:class:`torch.utils.flop_counter.FlopCounterMode` counts them).

Memory: parameters, gradients and AdamW's two moments; the KV cache
``2 · layers · B · H_kv · d_h · T · bytes`` (this is what grouped-/multi-query attention shrinks);
and the ``B · H · T · T_k`` weight matrix one layer of the explicit ``"math"`` backend holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from attnlab._checks import check_positive_int
from attnlab.models.config import GPTConfig, TransformerConfig

__all__ = ["FlopReport", "flops", "kv_cache_bytes"]


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
            (their sum), ``"kv_cache"`` and ``"attention_matrix"`` (one layer's weights, math path).
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
    prefix: str, t_q: int, t_k: int, d: int, h: int, h_kv: int, *, cross: bool = False
) -> dict[str, int]:
    """Forward FLOPs of one attention layer for one sequence."""
    d_h = d // h
    kv = h_kv * d_h
    terms: dict[str, int] = {}
    if cross:
        terms[f"{prefix}/q"] = 2 * t_q * d * d  # Q = x W^Q, from the target
        terms[f"{prefix}/kv"] = 2 * t_k * d * 2 * kv  # K, V = m W^K, m W^V, from the source
    else:
        terms[f"{prefix}/qkv"] = 2 * t_q * d * (d + 2 * kv)  # [Q K V] = x [W^Q W^K W^V]
    terms[f"{prefix}/scores"] = 2 * h * t_q * t_k * d_h  # S = Q Kᵀ
    terms[f"{prefix}/reduce"] = 2 * h * t_q * t_k * d_h  # O = P V
    terms[f"{prefix}/proj"] = 2 * t_q * d * d  # O W^O
    return terms


def _ffn_terms(prefix: str, t: int, d: int, d_ff: int) -> dict[str, int]:
    return {f"{prefix}/ffw1": 2 * t * d * d_ff, f"{prefix}/ffw2": 2 * t * d_ff * d}


def _scaled(terms: dict[str, int], factor: int) -> dict[str, int]:
    return {k: v * factor for k, v in terms.items()}


def _add(total: dict[str, int], terms: dict[str, int]) -> None:
    for k, v in terms.items():
        total[k] = total.get(k, 0) + v


def _attn_params(d: int, h: int, h_kv: int, bias: bool) -> int:
    kv = h_kv * (d // h)
    return d * (d + 2 * kv) + d * d + (d + 2 * kv + d if bias else 0)


def _ffn_params(d: int, d_ff: int, bias: bool) -> int:
    return 2 * d * d_ff + (d_ff + d if bias else 0)


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
    tokens = seq_len
    if geo["kind"] == "transformer":
        tokens += seq_len if src_len is None else _check_length(geo, "src_len", src_len)
    per_token = 2 * geo["layers_dec"] * geo["kv_heads"] * (geo["d"] // geo["h"])
    return per_token * batch * tokens * _dtype_bytes(dtype)


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
            raise ValueError(
                "src_len is only for the encoder-decoder (TransformerConfig), got a GPTConfig"
            )
        _check_length(geo, "src_len", src_len)
    d, h, h_kv, d_ff, bias = geo["d"], geo["h"], geo["kv_heads"], geo["d_ff"], geo["bias"]
    nbytes = _dtype_bytes(dtype)
    fwd: dict[str, int] = {}
    params: dict[str, int] = {}
    t = seq_len
    if geo["kind"] == "gpt":
        cfg: Any = config
        layers = cfg.n_layer
        _add(fwd, _scaled(_attention_terms("attention", t, t, d, h, h_kv), layers))
        _add(fwd, _scaled(_ffn_terms("mlp", t, d, d_ff), layers))
        fwd["lm_head"] = 2 * t * d * cfg.vocab_size
        params["embedding/token"] = cfg.vocab_size * d
        if cfg.positions == "learned":
            params["embedding/position"] = cfg.n_positions * d
        params["attention"] = layers * (_attn_params(d, h, h_kv, bias) + _ln_params(d, bias))
        params["mlp"] = layers * (_ffn_params(d, d_ff, bias) + _ln_params(d, bias))
        params["ln_f"] = _ln_params(d, bias)
        params["lm_head"] = 0  # tied to the token embedding
        attn_matrix = batch * h * t * t * nbytes
    else:
        cfg = config
        s = seq_len if src_len is None else src_len
        n_enc, n_dec = cfg.num_encoder_layers, cfg.num_decoder_layers
        _add(fwd, _scaled(_attention_terms("encoder/attention", s, s, d, h, h_kv), n_enc))
        _add(fwd, _scaled(_ffn_terms("encoder/mlp", s, d, d_ff), n_enc))
        _add(fwd, _scaled(_attention_terms("decoder/self_attention", t, t, d, h, h_kv), n_dec))
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
        params["encoder"] = n_enc * (attn + ffn + 2 * ln) + final_ln
        params["decoder"] = n_dec * (2 * attn + ffn + 3 * ln) + final_ln
        params["lm_head"] = 0 if cfg.tie_output else cfg.tgt_vocab_size * d
        attn_matrix = batch * h * max(t, s) * max(t, s) * nbytes
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
            "d_ff": 4 * config.n_embd, "bias": config.bias, "layers_dec": config.n_layer,
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
        raise TypeError(
            f"config must be a GPTConfig or a TransformerConfig, got {type(config).__name__}"
        )
    if num_kv_heads is not None:
        check_positive_int("num_kv_heads", num_kv_heads)
        if geo["h"] % num_kv_heads != 0:
            raise ValueError(
                f"num_kv_heads must divide the {geo['h']} query heads, got {num_kv_heads}"
            )
        geo["kv_heads"] = num_kv_heads
    return geo


def _check_length(geo: dict[str, Any], name: str, value: int) -> int:
    """``value`` (a checked positive length) when the model can hold it: at most its positions."""
    check_positive_int(name, value)
    if value > geo["max_len"]:
        raise ValueError(
            f"{name} must be at most {geo['max_len_name']} = {geo['max_len']} (the longest "
            f"sequence the model holds), got {value}"
        )
    return value


def _dtype_bytes(dtype: object) -> int:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    return torch.empty((), dtype=dtype).element_size()
