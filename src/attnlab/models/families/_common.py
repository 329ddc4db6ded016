"""What the families' conversions share: reading ``config.json`` fields, and taking tensors out of
a state dict so that nothing is left unread (a tensor the model does not use is an error, not a
silent drop)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from attnlab._budget import check_fits
from attnlab._checks import REQUIRED, json_bool, json_float, json_int, json_optional_int
from attnlab.errors import ArgumentError
from attnlab.models.config import GPTConfig
from attnlab.nn.rope import RopeScaling

__all__ = [
    "TensorTaker",
    "activation_of",
    "build_config",
    "ends_from_hf",
    "ends_to_hf",
    "head_sizes",
    "hf_activation",
    "json_bool",
    "json_float",
    "json_optional_int",
    "qkv_from_hf",
    "qkv_to_hf",
    "rope_fields",
    "size",
    "tied_head",
]

#: Hugging Face ``hidden_act`` → attnlab's ``activation``
_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
}
_BACK = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}

#: the largest value of each kind of size a ``config.json`` may give, checked before anything is
#: built from it (the largest published decoders stay far below: 126 layers, 128 heads, widths
#: of 53 248, vocabularies of 256 000, contexts of 10⁷); the positions are bounded by the memory
#: of their rotary tables too (:func:`build_config`)
SIZE_CAPS = {
    "width": (2**20, "a model width or hidden size"),
    "heads": (2**14, "a number of attention heads"),
    "layers": (2**14, "a number of layers"),
    "vocab": (2**24, "a vocabulary size"),
    "positions": (2**27, "a context length"),
}


def size(config: Mapping[str, Any], key: str, kind: str, default: Any = REQUIRED) -> int:
    """A size of ``config.json``: a JSON integer ≥ 1 of at most the cap of its ``kind``
    (:data:`SIZE_CAPS`).

    Args:
        config: the config dict.
        key: its key.
        kind: ``"width"``, ``"heads"``, ``"layers"``, ``"vocab"`` or ``"positions"``.
        default: the value when absent (default: it must be present).

    Returns:
        The size.
    """
    cap, why = SIZE_CAPS[kind]
    return json_int(config, key, default, cap=cap, why=f"the most attnlab reads for {why}")


def build_config(config: Mapping[str, Any], positions_key: str, **fields: Any) -> GPTConfig:
    """A :class:`~attnlab.models.config.GPTConfig` of a ``config.json``, refused before it is
    built when its rotary tables (``cos`` and ``sin``, float32, one row per position, computed
    from float32 angles) would not fit in memory: a context length of 10⁹ asks for 16 GB
    even for a model built on the ``meta`` device.

    Args:
        config: the config dict (for the message).
        positions_key: the key of the context length (``max_position_embeddings``).
        **fields: the config's fields.

    Returns:
        The config.

    Raises:
        ArgumentError: one line naming the key, its value and the bytes needed and there are.
    """
    out = GPTConfig(**fields)
    if out.positions == "rope":
        needed = 6 * out.n_positions * out.rotary_width
        check_fits(
            f"config.json's {positions_key} = {config.get(positions_key)}",
            needed,
            what=f"the rotary tables of {out.rotary_width} dimensions at every position",
        )
    return out


def activation_of(name: object) -> str:
    """attnlab's activation of Hugging Face's ``hidden_act``."""
    if not isinstance(name, str) or name not in _ACTIVATIONS:
        raise ArgumentError(f"hidden_act must be one of {', '.join(_ACTIVATIONS)}, got {name!r}")
    return _ACTIVATIONS[name]


def hf_activation(name: str) -> str:
    """Hugging Face's ``hidden_act`` of attnlab's activation."""
    return _BACK[name]


def _first_float(*sources: tuple[Mapping[str, Any], str, str], default: float) -> float:
    """The first of ``(dict, key, where)`` that is set (not absent, not ``null``), as a float."""
    for data, key, where in sources:
        if data.get(key) is not None:
            return json_float(data, key, where=where)
    return default


def rope_fields(config: Mapping[str, Any], d_head: int, *, partial: bool) -> dict[str, Any]:
    """The rotary fields of a :class:`~attnlab.models.config.GPTConfig` from ``config.json``:
    the base, the rotated dimensions and the scaling, read from the ``rope_parameters`` of
    ``transformers`` 5 or the ``rope_theta`` / ``rope_scaling`` / ``partial_rotary_factor`` /
    ``rotary_pct`` / ``rotary_emb_base`` keys of older files.

    Args:
        config: the config dict.
        d_head: the head width.
        partial: whether the family's ``transformers`` class reads ``partial_rotary_factor``
            (GPT-NeoX does; Llama's default rotary embedding rotates the whole head whatever
            the factor, so a Llama family passes ``False`` and the factor is ignored as there,
            or refused with a rope scaling, whose ``transformers`` tables would not fit the head).

    Returns:
        ``rope_base``, ``rotary_dim`` (``None`` for the whole head), ``rope_scaling``,
        ``rope_pairing="halves"`` (Hugging Face's ``rotate_half``).
    """
    params = config.get("rope_parameters")
    params = {} if params is None else params
    if not isinstance(params, Mapping):
        raise ArgumentError(f"config.json's rope_parameters must be a dict, got {params!r}")
    inner = "config.json's rope_parameters"
    theta = _first_float(
        (params, "rope_theta", inner), (config, "rope_theta", "config.json"),
        (config, "rotary_emb_base", "config.json"), default=10000.0,
    )  # fmt: skip
    fraction = _first_float(
        (params, "partial_rotary_factor", inner), (config, "partial_rotary_factor", "config.json"),
        (config, "rotary_pct", "config.json"), default=1.0,
    )  # fmt: skip
    scaling = config.get("rope_scaling")  # null or {}: the scaling, if any, is rope_parameters'
    empty = scaling is None or (isinstance(scaling, Mapping) and not scaling)
    scaling = RopeScaling.from_dict((params or None) if empty else scaling)
    if not partial:
        if fraction != 1.0 and scaling is not None:
            raise ArgumentError(
                f"partial_rotary_factor must be 1 with a rope scaling ({scaling.rope_type!r}) "
                f"for this family, got {fraction}: its transformers class rotates whole heads"
            )
        fraction = 1.0
    rotary = int(d_head * fraction)
    if rotary % 2 or rotary > d_head or rotary < 2:
        raise ArgumentError(
            f"partial_rotary_factor {fraction} of head_dim {d_head} gives {rotary} rotated "
            "dimensions; they must be even, at least 2 and at most head_dim"
        )
    return {
        "rope_base": theta,
        "rotary_dim": None if rotary == d_head else rotary,
        "rope_scaling": scaling,
        "rope_pairing": "halves",
    }


def hf_rope(config: Any) -> dict[str, Any]:
    """``config.json``'s rotary keys of a config (both the old keys and ``rope_parameters``)."""
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_base}
    if config.rope_scaling is not None:
        params.update(config.rope_scaling.to_dict())
    if config.rotary_dim is not None:
        params["partial_rotary_factor"] = config.rotary_dim / config.d_head
    out: dict[str, Any] = {"rope_theta": config.rope_base, "rope_parameters": params}
    if config.rope_scaling is not None:
        out["rope_scaling"] = config.rope_scaling.to_dict()
    return out


class TensorTaker:
    """A state dict read once: :meth:`take` removes what it returns, :meth:`done` refuses what
    is left (other than the names ``ignore`` matches: buffers older ``transformers`` saved).

    Args:
        state: the state dict.
        where: how to name it in errors (a file, "the model").
        ignore: name endings that may be left.
    """

    def __init__(
        self, state: Mapping[str, torch.Tensor], where: str, ignore: Iterable[str] = ()
    ) -> None:
        self.left = dict(state)
        self.where = where
        self.ignore = tuple(ignore)

    def take(self, name: str) -> torch.Tensor:
        """The tensor ``name`` (an error naming it when absent)."""
        if name not in self.left:
            raise ArgumentError(f"{self.where} has no tensor {name!r}")
        return self.left.pop(name)

    def maybe(self, name: str) -> torch.Tensor | None:
        """The tensor ``name``, or ``None`` when absent."""
        return self.left.pop(name, None)

    def move(
        self,
        out: dict[str, torch.Tensor],
        pairs: Iterable[tuple[str, str]],
        source: str,
        target: str,
    ) -> None:
        """Rename each pair's weight and bias, those present: ``source + a + ".weight"`` becomes
        ``target + b + ".weight"`` in ``out`` for each ``(a, b)`` (a bias only where there is one).

        Args:
            out: the state dict being built.
            pairs: ``(name here, name there)``.
            source: the prefix here (a layer's).
            target: the prefix there.
        """
        for here, there in pairs:
            for kind in ("weight", "bias"):
                t = self.maybe(f"{source}{here}.{kind}")
                if t is not None:
                    out[f"{target}{there}.{kind}"] = t

    def done(self) -> None:
        """Refuse tensors nobody took."""
        left = sorted(n for n in self.left if not n.endswith(self.ignore))
        if left:
            more = f" and {len(left) - 5} more" if len(left) > 5 else ""
            raise ArgumentError(
                f"{self.where} has tensors this model does not use: {', '.join(left[:5])}{more}"
            )


def tied_head(head: torch.Tensor | None, embedding: torch.Tensor, head_name: str) -> None:
    """Refuse an output matrix stored beside the embedding of a tied config when it differs:
    ``tie_word_embeddings: true`` makes the embedding the head, and silently dropping a head
    of its own would give other logits than the file's (``transformers`` keeps the stored
    head). A copy equal to the embedding, as some writers store, is accepted; the tensors of a
    file's header (the ``meta`` device) have no values to compare.

    Args:
        head: the stored head, or ``None``.
        embedding: the token embedding.
        head_name: the head's name in the file.

    Raises:
        ArgumentError: the head differs from the embedding (one line naming both).

    Shape:
        ``head``, ``embedding``: ``(vocab_size, n_embd)``.
    """
    if head is None or "meta" in (head.device.type, embedding.device.type):
        return
    if head.shape != embedding.shape or not torch.equal(head, embedding):
        raise ArgumentError(
            f"the weights hold a {head_name} that differs from the token embedding, but "
            "config.json's tie_word_embeddings is true (the head is the embedding), so the "
            "stored head would be dropped"
        )


def ends_from_hf(src: TensorTaker, config: GPTConfig) -> dict[str, torch.Tensor]:
    """A Llama-layout file's ends, taken from ``src``: ``model.embed_tokens``, ``model.norm``
    and, untied, ``lm_head`` (a tied config's stored head checked by :func:`tied_head`).

    Args:
        src: the file's tensors.
        config: the model's config (``tie_embeddings``).

    Returns:
        attnlab's ``transformer.wte.weight``, ``transformer.ln_f.weight`` (and ``lm_head.weight``).

    Shape:
        the embedding and the head ``(vocab_size, n_embd)``, the norm ``(n_embd,)``.
    """
    out = {
        "transformer.wte.weight": src.take("model.embed_tokens.weight"),
        "transformer.ln_f.weight": src.take("model.norm.weight"),
    }
    head = src.maybe("lm_head.weight")
    if not config.tie_embeddings:
        out["lm_head.weight"] = src.take("lm_head.weight") if head is None else head
    else:
        tied_head(head, out["transformer.wte.weight"], "lm_head.weight")
    return out


def ends_to_hf(src: TensorTaker, config: GPTConfig) -> dict[str, torch.Tensor]:
    """The inverse of :func:`ends_from_hf`: attnlab's embedding, final norm and head under
    Llama's names (a tied head left out, as ``save_pretrained`` writes it).

    Args:
        src: the model's tensors.
        config: the model's config (``tie_embeddings``).

    Returns:
        ``model.embed_tokens.weight``, ``model.norm.weight`` (and ``lm_head.weight``).

    Shape:
        as :func:`ends_from_hf`.
    """
    out = {
        "model.embed_tokens.weight": src.take("transformer.wte.weight"),
        "model.norm.weight": src.take("transformer.ln_f.weight"),
    }
    head = src.take("lm_head.weight")
    if not config.tie_embeddings:
        out["lm_head.weight"] = head
    return out


def qkv_from_hf(src: TensorTaker, out: dict[str, torch.Tensor], hf: str, at: str) -> None:
    """Stack a layer's ``q_proj``, ``k_proj``, ``v_proj`` (weights, and biases when all three
    have one) into attnlab's ``c_attn``: rows ``[q; k; v]``.

    Args:
        src: the file's tensors.
        out: the state dict being built.
        hf: the layer's prefix in the file (``model.layers.i.``).
        at: its prefix here (``transformer.h.i.``).

    Shape:
        ``(H · d_head, d)``, ``(H_kv · d_head, d)`` ×2 → ``((H + 2 · H_kv) · d_head, d)``.
    """
    for kind in ("weight", "bias"):
        parts = [src.maybe(f"{hf}self_attn.{p}_proj.{kind}") for p in "qkv"]
        if all(t is not None for t in parts):
            out[f"{at}attn.c_attn.{kind}"] = torch.cat(parts)  # type: ignore[arg-type]
        elif any(t is not None for t in parts) or kind == "weight":
            raise ArgumentError(f"the weights lack some of {hf}self_attn.q/k/v_proj.{kind}")


def qkv_to_hf(
    src: TensorTaker, out: dict[str, torch.Tensor], hf: str, at: str, config: GPTConfig
) -> None:
    """The inverse of :func:`qkv_from_hf`: ``c_attn`` split into ``q_proj``, ``k_proj``,
    ``v_proj``.

    Args:
        src: the model's tensors.
        out: the state dict being built.
        hf: the layer's prefix there.
        at: its prefix here.
        config: the model's config (the heads' sizes).

    Shape:
        as :func:`qkv_from_hf`, the other way.
    """
    kv = config.kv_heads * config.d_head
    for kind in ("weight", "bias"):
        fused = src.maybe(f"{at}attn.c_attn.{kind}")
        if fused is not None:
            for p, t in zip("qkv", fused.split([config.n_embd, kv, kv])):
                out[f"{hf}self_attn.{p}_proj.{kind}"] = t


def head_sizes(config: Mapping[str, Any], head_dim: int | None = None) -> tuple[int, int, int]:
    """The width, the query heads and the key/value heads of a ``config.json``
    (``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``), refused in one line
    when its ``head_dim`` times the heads is not the width: attnlab's heads split the model
    width.

    Args:
        config: the config dict.
        head_dim: the family's default ``head_dim`` when the file has none (``None``: the
            width over the heads; Gemma 2's is 256).

    Returns:
        ``(d, heads, kv_heads)``.
    """
    d = size(config, "hidden_size", "width")
    heads = size(config, "num_attention_heads", "heads")
    kv = size(config, "num_key_value_heads", "heads", heads)
    head = json_optional_int(config, "head_dim") or head_dim or d // heads
    if head * heads != d:
        raise ArgumentError(
            f"config.json's head_dim = {head} times num_attention_heads = {heads} must be "
            f"hidden_size = {d} (attnlab's heads split the model width)"
        )
    return d, heads, kv
