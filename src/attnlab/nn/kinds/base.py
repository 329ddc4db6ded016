"""What an attention kind is: one spec object that owns its options, builds its layer and
cache, counts its FLOPs and names its command-line options; and the registry of kinds.

A model config holds one :class:`AttentionSpec` (``GPTConfig(attention=SlidingSpec(window=256))``)
instead of a name plus loose fields. Everything that depends on the kind asks the spec:

=============================  ==================================================================
the model builds a layer       ``spec.build(site)`` (``site``: the model's sizes and role,
                               :class:`AttentionSite`)
decoding                       ``layer.new_cache(...)`` (each layer makes its own cache)
the FLOP calculator            ``spec.core_flops(...)``, ``spec.matrix_elements(...)``,
                               ``spec.cache_bytes(...)``, ``spec.extra_parameters(...)``
the command line               ``spec_class.cli_options`` and :func:`spec_from_cli`
saved configs                  ``spec.to_dict()`` / :func:`spec_from_dict` (and
                               :func:`spec_from_legacy` for configs saved before specs existed)
=============================  ==================================================================

A new kind is a frozen dataclass subclass registered with :func:`register_attention`; nothing
else in attnlab changes (``tests/models/test_new_attention_kind.py`` defines one in a test file
and trains, captures, counts and decodes it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

from attnlab.errors import ArgumentError, ArgumentTypeError

if TYPE_CHECKING:
    from attnlab.nn.multihead import MultiHeadAttention
    from attnlab.nn.positional import RotaryEmbedding

__all__ = [
    "AttentionSite",
    "AttentionSpec",
    "CliOption",
    "attention_kinds",
    "check_int_field",
    "register_attention",
    "spec_class",
    "spec_from_cli",
    "spec_from_dict",
    "spec_from_legacy",
    "spec_to_cli",
    "unregister_attention",
]

S = TypeVar("S", bound="type[AttentionSpec]")


@dataclass(frozen=True)
class CliOption:
    """One command-line option of an attention kind (``--window`` of ``sliding``).

    The command line turns it into an ``argparse`` argument: ``kind`` names the parser
    (``"positive_int"``, ``"non_negative_int"``, ``"float"``, ``"str"``); the value goes to the
    spec's field ``field``.

    Attributes:
        flag: the option, e.g. ``"--window"``.
        field: the spec's field it sets, e.g. ``"window"``.
        kind: the value's parser, one of the names above.
        help: the help text.
        dest: the argparse destination (default the flag's name with ``_``); it is also the key
            under which a run folder saves the option.
        metavar: the value's name in the usage line, or ``None``.
        required: the kind cannot do without it (``--attention sliding`` needs ``--window``).
    """

    flag: str
    field: str
    kind: str = "positive_int"
    help: str = ""
    dest: str = ""
    metavar: str | None = None
    required: bool = False

    def __post_init__(self) -> None:
        if not self.flag.startswith("--"):
            raise ArgumentError(f"flag must start with '--', got {self.flag!r}")
        if self.kind not in ("positive_int", "non_negative_int", "float", "str"):
            raise ArgumentError(
                f"kind must be 'positive_int', 'non_negative_int', 'float' or 'str', got "
                f"{self.kind!r}"
            )
        if not self.dest:
            object.__setattr__(self, "dest", self.flag[2:].replace("-", "_"))


@dataclass(frozen=True)
class AttentionSite:
    """Where a self-attention layer goes: the model's sizes and the layer's role.

    A model describes each place it puts a self-attention layer with a site and asks the
    config's spec to build it (:meth:`AttentionSpec.build`); the site's :meth:`layer` then
    instantiates the class the spec chose with the model's common arguments.

    Attributes:
        d_model: model width.
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads ``H_kv`` (``None``: ``H``).
        causal: the layer's attention is causal (a GPT, a decoder) rather than bidirectional
            (an encoder).
        max_len: the most positions the model holds (``n_positions``, ``max_len``).
        dropout: attention dropout.
        bias: biases in the projections.
        backend: the attention backend (``"auto"``, ``"math"``, …).
        positions: the model's positions, ``"learned"``, ``"rope"``, ``"alibi"`` or
            ``"sinusoidal"``.
        rotary: the rotary embedding the layer applies, or ``None``.
        layer_class: the model's way to store projections: a function from an attention class
            to the class to build (GPT-2's ``c_attn``/``c_proj`` names); ``None`` keeps the class.
        layer_kwargs: more keyword arguments for that class (``resid_dropout`` for a GPT).
    """

    d_model: int
    num_heads: int
    num_kv_heads: int | None = None
    causal: bool = False
    max_len: int = 1024
    dropout: float = 0.0
    bias: bool = True
    backend: str = "auto"
    positions: str = "learned"
    rotary: RotaryEmbedding | None = field(default=None, compare=False)
    layer_class: Callable[[type], type] | None = field(default=None, compare=False)
    layer_kwargs: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def d_head(self) -> int:
        """Head width ``d_model / H``."""
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads actually used."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def layer(self, cls: type[MultiHeadAttention], **options: Any) -> MultiHeadAttention:
        """Build ``cls`` (through :attr:`layer_class`) with the site's common arguments.

        Args:
            cls: a :class:`~attnlab.nn.multihead.MultiHeadAttention` class.
            **options: the kind's own arguments (``window=``, ``num_features=``, …); they may
                also override the common ones.

        Returns:
            The layer.
        """
        built = cls if self.layer_class is None else self.layer_class(cls)
        common = {
            "num_kv_heads": self.num_kv_heads,
            "dropout": self.dropout,
            "bias": self.bias,
        }
        return built(self.d_model, self.num_heads, **{**common, **self.layer_kwargs, **options})


@dataclass(frozen=True)
class AttentionSpec:
    """One attention kind and its options: the base class of every spec.

    A subclass is a frozen dataclass whose fields are the kind's options, validated in
    ``__post_init__`` (:func:`check_int_field`), registered with :func:`register_attention`.
    It sets :attr:`name` and overrides what differs from full attention: :meth:`build` (the
    layer), the FLOP terms, and for a kind that cannot be causal :attr:`bidirectional_only`.
    """

    #: the kind's name: ``--attention NAME``, ``{"kind": NAME}`` in a saved config
    name: ClassVar[str] = ""
    #: its command-line options
    cli_options: ClassVar[tuple[CliOption, ...]] = ()
    #: the flat config fields of configs saved before specs existed: old field → spec field
    legacy_fields: ClassVar[Mapping[str, str]] = {}
    #: the kind cannot be causal: a causal-only model (a GPT) refuses it, and a causal site of
    #: a model that has both (the decoder) uses full attention
    bidirectional_only: ClassVar[bool] = False
    #: its layers are softmax attention over per-head, parameter-free patterns, computed by
    #: :class:`~attnlab.nn.multihead.MultiHeadAttention` itself: tensor parallelism may split
    #: them by heads (:mod:`attnlab.distributed.tensor_parallel`)
    shards_by_heads: ClassVar[bool] = False
    #: at a causal site its layers are softmax attention over a plain KV cache with no pattern
    #: beyond a causal window, computed by :class:`~attnlab.nn.multihead.MultiHeadAttention`
    #: itself: decoding may run over a static cache as one compiled step
    #: (:mod:`attnlab.decoding.compiled`, :class:`~attnlab.nn.static_cache.StaticKVCache`)
    decodes_statically: ClassVar[bool] = False

    # -- the model -----------------------------------------------------------------------------

    def check_model(self, *, causal_only: bool, positions: str) -> None:
        """Refuse a model this kind cannot serve (called by the configs' ``__post_init__``).

        Args:
            causal_only: the model's self-attention is all causal (a GPT).
            positions: the model's positions (``"learned"``, ``"rope"``, ``"alibi"``,
                ``"sinusoidal"``).

        Raises:
            ArgumentError: the combination cannot work.
        """
        if causal_only and self.bidirectional_only:
            raise ArgumentError(
                f"attention={self.name!r} is not available for a causal-only model (a GPT): it "
                f"cannot be causal; use a kind that can (e.g. 'sliding' or 'performer'), or use "
                f"it in a TransformerConfig encoder"
            )

    def at(self, *, causal: bool) -> AttentionSpec:
        """The spec a site of this causality uses: itself, or full attention at a causal site
        for a kind that cannot be causal (Linformer in the decoder).

        Args:
            causal: the site is causal.

        Returns:
            The spec in force there.
        """
        if causal and self.bidirectional_only:
            return spec_class("full")()
        return self

    def build(self, site: AttentionSite) -> MultiHeadAttention:
        """The self-attention layer of one site (full attention here).

        Args:
            site: the model's sizes and the layer's role.

        Returns:
            The layer, a :class:`~attnlab.nn.multihead.MultiHeadAttention` (or subclass).
        """
        from attnlab.nn.multihead import MultiHeadAttention

        return site.layer(MultiHeadAttention, backend=site.backend, rotary=site.rotary)

    def padded_mask(
        self, site: AttentionSite, keep: torch.Tensor, past: int
    ) -> torch.Tensor | None:
        """The kind's own pattern read at each row's token positions, for left-padded rows.

        A kind whose pattern depends on absolute positions (BigBird's blocks) gives the
        boolean pattern at the tokens' positions (a token's position counts the real tokens
        before it), and the model turns the layer's own pattern off for that call; others
        return ``None`` and cost nothing.

        Args:
            site: the layer's site.
            keep: ``True`` for the real tokens of every position so far (left padding).
            past: positions before this call's queries.

        Returns:
            ``None``, or the pattern (``True`` = may attend).

        Shape:
            keep ``(B, T_past + T)`` → ``(B, T, T_past + T)``.
        """
        return None

    # -- FLOPs and memory (the FLOP calculator, :mod:`attnlab.inspect.flops`) -----------------

    def core_flops(
        self, t_q: int, t_k: int, *, d_head: int, heads: int, kv_heads: int, site: AttentionSite
    ) -> dict[str, int]:
        """Forward FLOPs of the attention core (between the projections), one sequence.

        Full attention: every score, as the explicit backend computes them,
        ``QKᵀ`` and ``PV`` ``2 · H · T_q · T_k · d_h`` each.

        Args:
            t_q: queries.
            t_k: keys.
            d_head: head width ``d_h``.
            heads: query heads ``H``.
            kv_heads: key/value heads ``H_kv``.
            site: the layer's site (causality, the model's positions).

        Returns:
            ``{term: FLOPs}`` (``"scores"``, ``"reduce"``, …).
        """
        return {
            "scores": 2 * heads * t_q * t_k * d_head,  # S = Q Kᵀ
            "reduce": 2 * heads * t_q * t_k * d_head,  # O = P V
        }

    def matrix_elements(self, t_q: int, t_k: int, *, d_head: int, site: AttentionSite) -> int:
        """Elements per head of the layer's largest attention intermediate (``T_q · T_k``
        weights for full attention).

        Args:
            t_q: queries.
            t_k: keys.
            d_head: head width.
            site: the layer's site.

        Returns:
            The count.
        """
        return t_q * t_k

    def cache_bytes(
        self, seq_len: int, *, batch: int, kv_heads: int, d_head: int, dtype: torch.dtype
    ) -> int:
        """Bytes one causal layer's decoding cache holds after ``seq_len`` tokens: keys and
        values of every position, ``2 · B · H_kv · T · d_h`` numbers.

        Args:
            seq_len: tokens decoded.
            batch: sequences ``B``.
            kv_heads: ``H_kv``.
            d_head: ``d_h``.
            dtype: the cache's dtype.

        Returns:
            The size in bytes.
        """
        return 2 * batch * kv_heads * seq_len * d_head * dtype.itemsize

    def extra_parameters(self, site: AttentionSite) -> int:
        """Parameters the kind adds to a layer beyond the four projections (0 here).

        Args:
            site: the layer's site.

        Returns:
            The count.
        """
        return 0

    # -- saving ----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": name, <field>: <value>, …}``, JSON-ready.

        Returns:
            The dict :func:`spec_from_dict` reads back.
        """
        return {"kind": self.name, **dataclasses.asdict(self)}

    def label(self) -> str:
        """A short label for reports (``attnlab flops``), e.g. ``sliding window 256``; the name
        and the options here, ``""`` for full attention.

        Returns:
            The label.
        """
        params = " ".join(f"{k} {v}" for k, v in dataclasses.asdict(self).items())
        return f"{self.name} {params}".strip()


def check_int_field(spec: AttentionSpec, name: str, *, minimum: int = 1) -> None:
    """Check that ``spec.<name>`` is an int of at least ``minimum`` (a spec's ``__post_init__``).

    Args:
        spec: the spec.
        name: the field.
        minimum: the smallest value allowed. Default 1.

    Raises:
        ArgumentTypeError: not an int (a bool is not one).
        ArgumentError: below ``minimum``, or beyond 64 bits (seeds feed torch generators).
    """
    value = getattr(spec, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        what = "a positive int" if minimum == 1 else f">= {minimum}"
        raise ArgumentError(f"{name} must be {what}, got {value}")
    if value >= 2**63:
        raise ArgumentError(f"{name} must be below 2**63, got {value}")


# -- the registry ----------------------------------------------------------------------------------

_KINDS: dict[str, type[AttentionSpec]] = {}


def register_attention(kind: S, /) -> S:
    """Register an attention kind (a class decorator): ``--attention NAME``, saved configs and
    :func:`spec_from_dict` then know it.

    Args:
        kind: a frozen-dataclass subclass of :class:`AttentionSpec` with a :attr:`~AttentionSpec.name`.

    Returns:
        ``kind``.

    Raises:
        ArgumentTypeError: ``kind`` is not an ``AttentionSpec`` dataclass.
        ArgumentError: no name, a name taken by another class, or a command-line option or
            legacy field another kind already has.
    """
    cls = kind
    if not (isinstance(cls, type) and issubclass(cls, AttentionSpec)):
        raise ArgumentTypeError(f"kind must be an AttentionSpec subclass, got {cls!r}")
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise ArgumentTypeError(f"{cls.__name__} must be a frozen dataclass")
    name = cls.name
    if not isinstance(name, str) or not name.isidentifier():
        raise ArgumentError(f"{cls.__name__}.name must be an identifier, got {name!r}")
    old = _KINDS.get(name)
    if old is not None and old.__qualname__ != cls.__qualname__:
        raise ArgumentError(f"attention kind {name!r} is already registered by {old.__name__}")
    for other in _KINDS.values():
        if other.name == name:
            continue
        taken = {o.dest for o in other.cli_options} & {o.dest for o in cls.cli_options}
        taken |= set(other.legacy_fields) & set(cls.legacy_fields)
        if taken:
            raise ArgumentError(
                f"{cls.__name__} reuses {', '.join(sorted(taken))} of attention kind "
                f"{other.name!r}: options and fields must be the kind's own"
            )
    _KINDS[name] = cls
    return cls


def unregister_attention(name: str) -> None:
    """Remove a kind registered with :func:`register_attention` (a test's or a plugin's); the
    built-in kinds stay.

    Args:
        name: the kind's name.

    Raises:
        ArgumentError: an unknown name, or a built-in kind.
    """
    cls = spec_class(name)
    if cls.__module__.startswith("attnlab.nn.kinds."):
        raise ArgumentError(f"attention kind {name!r} is built in and cannot be removed")
    del _KINDS[name]


def attention_kinds() -> tuple[str, ...]:
    """The registered kinds' names, in registration order (the built-in ones first).

    Returns:
        The names.
    """
    return tuple(_KINDS)


def spec_class(name: object) -> type[AttentionSpec]:
    """The spec class registered under ``name``.

    Args:
        name: a kind's name.

    Returns:
        The class.

    Raises:
        ArgumentError: an unknown name (the message lists the known ones).
    """
    cls = _KINDS.get(name) if isinstance(name, str) else None
    if cls is None:
        known = ", ".join(repr(k) for k in _KINDS)
        raise ArgumentError(f"attention must be one of {known}, got {name!r}")
    return cls


def spec_from_dict(data: object) -> AttentionSpec:
    """Rebuild a spec from :meth:`AttentionSpec.to_dict`'s dict (or a bare kind name).

    Args:
        data: ``{"kind": name, <field>: <value>, …}`` or ``name``.

    Returns:
        The spec.

    Raises:
        ArgumentError: an unknown kind or field, or a value the spec refuses.
        ArgumentTypeError: ``data`` is neither a dict nor a string.
    """
    if isinstance(data, str):
        return _construct(spec_class(data), {})
    if not isinstance(data, Mapping):
        raise ArgumentTypeError(
            f"attention must be an AttentionSpec, a kind's name or its dict, got "
            f"{type(data).__name__}"
        )
    params = dict(data)
    cls = spec_class(params.pop("kind", None))
    return _construct(cls, params)


def _construct(cls: type[AttentionSpec], params: Mapping[str, Any]) -> AttentionSpec:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - names)
    if unknown:
        raise ArgumentError(
            f"attention {cls.name!r} has no option {', '.join(unknown)} (its options: "
            f"{', '.join(sorted(names)) or 'none'})"
        )
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in params
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ArgumentError(f"attention={cls.name!r} needs {missing[0]} (a positive int), got None")
    return cls(**params)


def spec_from_legacy(attention: object, fields: Mapping[str, Any]) -> AttentionSpec:
    """A spec from the flat fields of configs written before specs existed
    (``attention="sliding", window=256``), or from a spec plus such fields to change.

    ``None`` values are unset. Each field belongs to one kind (:attr:`AttentionSpec.legacy_fields`).

    Args:
        attention: a kind's name, or a spec.
        fields: old field → value.

    Returns:
        The spec.

    Raises:
        ArgumentError: a field of another kind, an unknown field, or a missing required one.
    """
    if isinstance(attention, AttentionSpec):
        cls, params = type(attention), dataclasses.asdict(attention)
    else:
        cls, params = spec_class(attention), {}
    owners = {old: kind for kind in _KINDS.values() for old in kind.legacy_fields}
    for old, value in fields.items():
        if value is None:
            continue
        if old not in cls.legacy_fields:
            owner = owners.get(old)
            if owner is None:
                raise ArgumentError(f"unknown attention field {old!r}")
            raise ArgumentError(
                f"{old} applies to attention={owner.name!r} only, got {old}={value!r} with "
                f"attention={cls.name!r}"
            )
        params[cls.legacy_fields[old]] = value
    return _construct(cls, params)


def legacy_field_names() -> frozenset[str]:
    """Every registered kind's legacy config fields (``window``, ``linformer_k``, …).

    Returns:
        The names.
    """
    return frozenset(old for kind in _KINDS.values() for old in kind.legacy_fields)


def spec_to_cli(spec: AttentionSpec | None) -> dict[str, Any]:
    """A spec as the command line's options (``{"attention": "sliding", "window": 256}``), the
    inverse of :func:`spec_from_cli`: every option of its kind that holds a value; nothing for
    full attention or ``None``.

    Args:
        spec: the spec, or ``None``.

    Returns:
        The options by their argparse ``dest``.
    """
    if spec is None or not spec.name or spec.name == "full":
        return {}
    out: dict[str, Any] = {"attention": spec.name}
    for option in spec.cli_options:
        value = getattr(spec, option.field)
        if value is not None:
            out[option.dest] = value
    return out


def cli_dests() -> tuple[str, ...]:
    """``attention`` and every registered kind's option dests (``window``, ``linformer_k``, …).

    Returns:
        The dests.
    """
    return ("attention", *(o.dest for kind in _KINDS.values() for o in kind.cli_options))


def spec_from_cli(attention: str | None, values: Mapping[str, Any]) -> AttentionSpec:
    """The spec of ``--attention NAME`` and its options, as the command line parsed them.

    Args:
        attention: the ``--attention`` value (``None``: ``"full"``).
        values: every kind's option by ``dest`` (unset ones ``None``).

    Returns:
        The spec.

    Raises:
        ArgumentError: an option of another kind (``--window applies to --attention sliding``),
            a required option missing (``--attention sliding needs --window``), or a value the
            spec refuses.
    """
    cls = spec_class(attention or "full")
    params: dict[str, Any] = {}
    for kind in _KINDS.values():
        for option in kind.cli_options:
            value = values.get(option.dest)
            if value is None:
                if kind is cls and option.required:
                    raise ArgumentError(f"--attention {cls.name} needs {option.flag}")
                continue
            if kind is not cls:
                raise ArgumentError(
                    f"{option.flag} applies to --attention {kind.name}, got --attention {cls.name}"
                )
            params[option.field] = value
    try:
        return _construct(cls, params)
    except ArgumentError as exc:  # a value the spec refuses: name the option, not the field
        message = str(exc)
        for option in cls.cli_options:
            if message.startswith(f"{option.field} "):
                message = option.flag + message[len(option.field) :]
        raise ArgumentError(message) from exc
