"""The attention weights of one fixed probe input, recorded every few training steps.

A trainer runs the same probe (a sentence, a source/target pair) through the model every ``N``
steps, from step 0 (before training) on, and keeps the attention weights of every layer in a
:class:`ProbeHistory`, with its checks and its file form (:meth:`ProbeHistory.save`,
:meth:`ProbeHistory.load`). The figures drawn from it are in :mod:`attnlab.viz.evolution`, its
viewer in :mod:`attnlab.viz.evolution_viewer`.

Recording, e.g. inside a training loop::

    history = ProbeHistory.new(tokens=probe_words)            # a GPT; or source=…, target=…
    for step in range(num_steps + 1):
        if step % every == 0:
            with torch.no_grad(), attnlab.inspect.capture(model) as cache:
                model(probe_ids)
            history.record(step, cache.attentions, cache.kinds, projected=cache.projected)
        ...                                                     # one optimisation step

**Projected keys (Linformer).** A :class:`~attnlab.nn.linformer.LinformerAttention` layer
attends over the ``k`` rows of ``E K`` (Wang et al. 2020), each a learned mix of every key
position, so its weights are ``T_q × k`` and their columns are not tokens. Given
``projected=cache.projected``, :meth:`ProbeHistory.record` keeps such a layer as it computes: its
key sequence is the ``k`` row labels ``"E·K row j"`` (a sequence of their own,
``"E·K rows (k = 8)"``), and beside the weights it records the effective weights ``A · F`` over
the key tokens at each step (:meth:`~attnlab.inspect.capture.ProjectedKeys.effective_weights`:
the layer's output is exactly ``(A F) V``; signed, and ``F`` itself changes as the model trains).
The figures draw the ``T × k`` weights; the viewer shows both, with the note the viewer of a
trained model shows.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from attnlab._checks import shape_str
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.viz.files import write_file

if TYPE_CHECKING:
    from attnlab.inspect.capture import ProjectedKeys

__all__ = ["ProbeHistory"]

KINDS = ("self", "cross")


def _is_cross_name(name: str) -> bool:
    return bool(re.search(r"cross|src_attn|enc_dec", name))


def _is_encoder_name(name: str) -> bool:
    return name.startswith("encoder") or ".encoder." in name


@dataclass
class ProbeHistory:
    """The attention weights of one fixed probe input, recorded at several training steps.

    Attributes:
        steps: the recorded steps, strictly ascending (the first is usually 0, before training).
        attentions: layer path → weights ``(S, H, T_q, T_k)`` with ``S = len(steps)`` (float32,
            CPU), e.g. ``"transformer.h.0.attn"`` or ``"decoder.layers.1.cross_attn"``.
        kinds: layer path → ``"self"`` or ``"cross"``.
        sequences: the probe's token texts by name (``{"tokens": [...]}`` for a GPT,
            ``{"source": [...], "target": [...]}`` for an encoder-decoder).
        layer_sequences: layer path → ``(query sequence name, key sequence name)``, e.g.
            ``("target", "source")`` for a cross-attention layer.
        projected: layer path → ``(method, token sequence name)`` for the layers whose keys are
            projected along the sequence (Linformer: ``("linformer", "source")``). Their key
            sequence holds the labels of the ``k`` projected rows (``"E·K row j"``), each a
            learned mix of every position of the named token sequence. Other layers are absent.
        effective: layer path → the effective weights ``A · F`` of a layer in ``projected`` at
            each step, over the positions of its token sequence (signed; rows need not sum to
            1); absent when they were not recorded.

    Build one with :meth:`new` and :meth:`record` (or :meth:`from_records`); the constructor
    checks that everything agrees.

    Shape:
        ``attentions[path]``: ``(S, H, T_q, T_k)``, ``T_q = len(sequences[query name])``,
        ``T_k = len(sequences[key name])`` (``k`` for a layer in ``projected``);
        ``effective[path]``: ``(S, H, T_q, T_tok)``, ``T_tok`` the length of the token sequence
        the projected rows mix.
    """

    steps: list[int]
    attentions: dict[str, torch.Tensor]
    kinds: dict[str, str]
    sequences: dict[str, list[str]]
    layer_sequences: dict[str, tuple[str, str]] = field(default_factory=dict)
    projected: dict[str, tuple[str, str]] = field(default_factory=dict)
    effective: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the containers first: a history may come from a file (see from_state_dict)
        steps = [_check_step("steps", s) for s in _as_list("steps", self.steps)]
        if any(b <= a for a, b in itertools.pairwise(steps)):
            raise ArgumentError(f"steps must be strictly ascending, got {steps[:8]}")
        self.steps = steps
        sequences = _as_dict("sequences", self.sequences)
        if not sequences:
            raise ArgumentError("sequences must name at least one token sequence, got none")
        self.sequences = {
            str(k): [str(t) for t in _as_list(f"sequences[{k!r}]", v)] for k, v in sequences.items()
        }
        self.attentions = {
            name: _as_weights(f"attentions[{name!r}]", w)
            for name, w in _as_dict("attentions", self.attentions).items()
        }
        self.kinds = _as_dict("kinds", self.kinds)
        self.layer_sequences = {
            n: _as_pair(f"layer_sequences[{n!r}]", v)
            for n, v in _as_dict("layer_sequences", self.layer_sequences).items()
        }
        self.projected = {
            n: _as_pair(f"projected[{n!r}]", v, "(method, token sequence) pair")
            for n, v in _as_dict("projected", self.projected).items()
        }
        self.effective = {
            n: _as_weights(f"effective[{n!r}]", w)
            for n, w in _as_dict("effective", self.effective).items()
        }
        if set(self.layer_sequences) != set(self.attentions):
            raise ArgumentError(
                "layer_sequences must name the query and key sequence of every layer in attentions, "
                f"got layers {sorted(self.attentions)} and layer_sequences for {sorted(self.layer_sequences)}"
            )
        for name, w in self.attentions.items():
            kind = self.kinds.get(name)
            if kind not in KINDS:
                raise ArgumentError(f"kinds[{name!r}] must be 'self' or 'cross', got {kind!r}")
            q_name, k_name = self.layer_sequences[name]
            for side in (q_name, k_name):
                if side not in self.sequences:
                    raise ArgumentError(
                        f"layer_sequences[{name!r}] names sequence {side!r}, not in sequences "
                        f"{list(self.sequences)}"
                    )
            want = (len(self.steps), len(self.sequences[q_name]), len(self.sequences[k_name]))
            if w.dim() != 4 or (w.shape[0], w.shape[2], w.shape[3]) != want:
                keys_only = w.dim() == 4 and w.shape[2] == want[1] and name not in self.projected
                hint = _PROJECTED_HINT if keys_only else ""
                raise ArgumentError(
                    f"attentions[{name!r}] must be (S, H, T_q, T_k) = ({want[0]}, H, {want[1]}, "
                    f"{want[2]}), got {shape_str(w.shape)}{hint}"
                )
        self._check_projected()

    def _check_projected(self) -> None:
        """``projected`` and ``effective`` agree with the layers and their sequences."""
        for name, (_, tokens) in self.projected.items():
            if name not in self.attentions:
                raise ArgumentError(
                    f"projected names layer {name!r}, not in attentions {sorted(self.attentions)}"
                )
            if tokens not in self.sequences:
                raise ArgumentError(
                    f"projected[{name!r}] names sequence {tokens!r}, not in sequences "
                    f"{list(self.sequences)}"
                )
        for name, e in self.effective.items():
            if name not in self.projected:
                raise ArgumentError(
                    f"effective weights of {name!r} need its projection: the layer is not in "
                    f"projected {sorted(self.projected)}"
                )
            w = self.attentions[name]
            t_tok = len(self.sequences[self.projected[name][1]])
            want = (w.shape[0], w.shape[1], w.shape[2], t_tok)
            if tuple(e.shape) != want:
                raise ArgumentError(
                    f"effective[{name!r}] must be (S, H, T_q, T_tok) = {want}, "
                    f"got {shape_str(e.shape)}"
                )

    # -- building --

    @classmethod
    def new(
        cls,
        *,
        tokens: Sequence[str] | None = None,
        source: Sequence[str] | None = None,
        target: Sequence[str] | None = None,
    ) -> ProbeHistory:
        """An empty history, to fill with :meth:`record`.

        Args:
            tokens: a GPT probe's token texts.
            source: an encoder-decoder probe's source token texts.
            target: an encoder-decoder probe's decoder input token texts (with ``source``).

        Returns:
            A history with no step yet.

        Raises:
            ValueError: neither ``tokens`` nor both ``source`` and ``target`` are given, or
                ``tokens`` is given together with them.
        """
        if tokens is not None:
            if source is not None or target is not None:
                raise ArgumentError(
                    "pass tokens (GPT) or source and target (encoder-decoder), not both"
                )
            sequences = {"tokens": [str(t) for t in tokens]}
        elif source is not None and target is not None:
            sequences = {"source": [str(t) for t in source], "target": [str(t) for t in target]}
        else:
            raise ArgumentError(
                "pass tokens (GPT) or both source and target (encoder-decoder), got neither"
            )
        return cls(
            steps=[], attentions={}, kinds={}, sequences=sequences, layer_sequences={},
            projected={}, effective={},
        )  # fmt: skip

    def record(
        self,
        step: int,
        attentions: Mapping[str, torch.Tensor | np.ndarray],
        kinds: Mapping[str, str] | None = None,
        *,
        projected: Mapping[str, ProjectedKeys] | None = None,
        batch_index: int = 0,
    ) -> None:
        """Append the weights of one step (e.g. ``cache.attentions``, ``cache.kinds`` and
        ``cache.projected`` of :func:`attnlab.inspect.capture`).

        Args:
            step: the training step; larger than every recorded one.
            attentions: layer path → ``(B, H, T_q, T_k)`` or ``(H, T_q, T_k)``; the same layers
                at every step.
            kinds: layer path → ``"self"``/``"cross"`` (default: ``"cross"`` when the path says
                so, e.g. ``cross_attn``).
            projected: layer path → :class:`~attnlab.inspect.capture.ProjectedKeys` for the
                layers whose keys are projected (Linformer; ``cache.projected``), the same layers
                at every step; default none. Their weights are ``(…, T_q, k)`` over the ``k``
                rows of ``E K``; their effective weights ``A · F`` are recorded with them.
            batch_index: which sequence of the batch is the probe. Default 0.

        Layers are given their token sequences on the first record: a GPT's layers
        ``("tokens", "tokens")``; an encoder-decoder's encoder layers ``("source", "source")``,
        cross-attention ``("target", "source")``, decoder self-attention ``("target", "target")``.
        A layer in ``projected`` has the ``k`` row labels as its key sequence instead
        (``"E·K rows (k = …)"``, added to :attr:`sequences`), and its token sequence in
        :attr:`projected`.

        Raises:
            ValueError: ``step`` is not larger than the last one, the layers (or the projected
                layers) differ from the first record's, or the shapes disagree with the token
                sequences.

        Shape:
            each weights tensor ``(B, H, T_q, T_k)`` or ``(H, T_q, T_k)``; stored as
            ``(H, T_q, T_k)`` (row ``batch_index``), effective weights as ``(H, T_q, T_tok)``.
        """
        step = _check_step("step", step)
        if self.steps and step <= self.steps[-1]:
            raise ArgumentError(
                f"step must be larger than the last recorded {self.steps[-1]}, got {step}"
            )
        if not attentions:
            raise ArgumentError("attentions must hold at least one layer, got none")
        if self.steps and set(attentions) != set(self.attentions):
            raise ArgumentError(
                f"attentions must hold the same layers at every step: recorded {sorted(self.attentions)}, "
                f"got {sorted(attentions)}"
            )
        kinds = dict(kinds or {})
        infos = {n: p for n, p in (projected or {}).items() if n in attentions}
        if self.steps and set(infos) != set(self.projected):
            raise ArgumentError(
                f"projected must name the same layers at every step: recorded "
                f"{sorted(self.projected)}, got {sorted(infos)}"
            )
        rows: dict[str, torch.Tensor] = {}
        effective: dict[str, torch.Tensor] = {}
        for name, w in attentions.items():
            full = torch.as_tensor(w).detach()
            t = full.to("cpu", torch.float32)
            if t.dim() == 4:
                if not 0 <= batch_index < t.shape[0]:
                    raise ArgumentError(
                        f"batch_index must be in [0, {t.shape[0]}), got {batch_index}"
                    )
                t = t[batch_index]
            if t.dim() != 3:
                raise ArgumentError(
                    f"attentions[{name!r}] must be (B, H, T_q, T_k) or (H, T_q, T_k), got {shape_str(t.shape)}"
                )
            rows[name] = t
            if name in infos:  # A · F over the key tokens, with this call's E, F and key mask
                e = infos[name].effective_weights(full).to("cpu", torch.float32)
                effective[name] = e[batch_index] if e.dim() == 4 else e
        new_layers = [n for n in rows if n not in self.attentions]
        for name in new_layers:
            kind = kinds.get(name) or ("cross" if _is_cross_name(name) else "self")
            if kind not in KINDS:
                raise ArgumentError(f"kinds[{name!r}] must be 'self' or 'cross', got {kind!r}")
            self.kinds[name] = kind
            q_name, k_name = self._sequences_of(name, kind)
            if name in infos:  # keys: the k projected rows, each a mix of the k_name positions
                info = infos[name]
                labels = list(info.labels)
                rows_name = _rows_sequence(info.k)
                if self.sequences.setdefault(rows_name, labels) != labels:
                    raise ArgumentError(
                        f"sequences[{rows_name!r}] holds other labels than layer {name!r}'s "
                        f"projected rows"
                    )
                self.projected[name] = (info.method, k_name)
                k_name = rows_name
            self.layer_sequences[name] = (q_name, k_name)
        for name, t in rows.items():
            q_name, k_name = self.layer_sequences[name]
            want = (len(self.sequences[q_name]), len(self.sequences[k_name]))
            if tuple(t.shape[1:]) != want:
                hint = _PROJECTED_HINT if name not in infos and t.shape[1] == want[0] else ""
                raise ArgumentError(
                    f"attentions[{name!r}] must have (T_q, T_k) = {want} (sequences {q_name!r}, "
                    f"{k_name!r}), got {shape_str(t.shape)}{hint}"
                )
            old = self.attentions.get(name)
            if old is not None and old.shape[1] != t.shape[0]:
                raise ArgumentError(
                    f"attentions[{name!r}] has {t.shape[0]} heads, recorded {old.shape[1]}"
                )
        for name, e in effective.items():
            t_tok = len(self.sequences[self.projected[name][1]])
            if e.shape[-1] != t_tok:
                raise ArgumentError(
                    f"the effective weights of {name!r} span {e.shape[-1]} key positions but its "
                    f"sequence {self.projected[name][1]!r} has {t_tok}"
                )
        for name, t in rows.items():
            old = self.attentions.get(name)
            self.attentions[name] = t[None] if old is None else torch.cat([old, t[None]])
        for name, e in effective.items():
            old = self.effective.get(name)
            self.effective[name] = e[None] if old is None else torch.cat([old, e[None]])
        self.steps.append(step)

    def _sequences_of(self, name: str, kind: str) -> tuple[str, str]:
        if "tokens" in self.sequences and len(self.sequences) == 1:
            return ("tokens", "tokens")
        if {"source", "target"} <= set(self.sequences):
            if kind == "cross":
                return ("target", "source")
            return ("source", "source") if _is_encoder_name(name) else ("target", "target")
        raise ArgumentError(
            f"cannot tell which sequences layer {name!r} reads from {list(self.sequences)}; "
            "set layer_sequences yourself"
        )

    @classmethod
    def from_records(
        cls,
        steps: Sequence[int],
        records: Sequence[Mapping[str, torch.Tensor | np.ndarray]],
        *,
        tokens: Sequence[str] | None = None,
        source: Sequence[str] | None = None,
        target: Sequence[str] | None = None,
        kinds: Mapping[str, str] | None = None,
        projected: Sequence[Mapping[str, ProjectedKeys]] | None = None,
        batch_index: int = 0,
    ) -> ProbeHistory:
        """A history from one ``cache.attentions``-like mapping per step (see :meth:`record`).

        Args:
            steps: the steps, strictly ascending.
            records: layer path → weights, one mapping per step.
            tokens: a GPT probe's token texts.
            source: an encoder-decoder probe's source token texts.
            target: an encoder-decoder probe's decoder input token texts.
            kinds: layer path → ``"self"``/``"cross"`` (default: from the paths).
            projected: one ``cache.projected`` per step, for layers with projected keys
                (Linformer); default none.
            batch_index: which sequence of each batch is the probe. Default 0.

        Returns:
            The filled history.

        Raises:
            ValueError: ``steps``, ``records`` (and ``projected``) differ in length, or a record
                does not agree with the others.

        Shape:
            each weights tensor ``(B, H, T_q, T_k)`` or ``(H, T_q, T_k)``.
        """
        if len(steps) != len(records):
            raise ArgumentError(
                f"steps and records must have the same length, got {len(steps)} and {len(records)}"
            )
        if projected is not None and len(projected) != len(records):
            raise ArgumentError(
                f"projected must hold one mapping per record, got {len(projected)} for "
                f"{len(records)} records"
            )
        history = cls.new(tokens=tokens, source=source, target=target)
        for i, (step, rec) in enumerate(zip(steps, records)):
            info = None if projected is None else projected[i]
            history.record(step, rec, kinds, projected=info, batch_index=batch_index)
        return history

    # -- reading --

    @property
    def layers(self) -> list[str]:
        """The recorded layer paths, in the order they ran."""
        return list(self.attentions)

    def tokens(self, layer: str) -> tuple[list[str], list[str]]:
        """The query and key token texts of one layer.

        Args:
            layer: a layer path of :attr:`attentions`.

        Returns:
            ``(query tokens, key tokens)``.

        Raises:
            ValueError: no such layer (the message lists the recorded ones).
        """
        self._check_layer("layer", layer)
        q_name, k_name = self.layer_sequences[layer]
        return self.sequences[q_name], self.sequences[k_name]

    def _check_layer(self, arg: str, layer: object) -> str:
        if not isinstance(layer, str) or layer not in self.attentions:
            known = ", ".join(self.attentions) or "none recorded"
            raise ArgumentError(f"{arg} must be a recorded layer ({known}), got {layer!r}")
        return layer

    # -- saving --

    def state_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts, strings, tensors) for ``torch.save`` or a checkpoint.

        Returns:
            The attributes by name, the weights as CPU float32 tensors.
        """
        return {
            "steps": list(self.steps),
            "attentions": dict(self.attentions),
            "kinds": dict(self.kinds),
            "sequences": {k: list(v) for k, v in self.sequences.items()},
            "layer_sequences": {k: list(v) for k, v in self.layer_sequences.items()},
            "projected": {k: list(v) for k, v in self.projected.items()},
            "effective": dict(self.effective),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> ProbeHistory:
        """The history saved by :meth:`state_dict` (or read from a file of the same layout).

        Every entry is checked (its container type, then what the constructor checks), so a
        damaged or crafted file gives a ``TypeError``/``ValueError`` naming the entry.
        ``projected`` and ``effective`` may be absent (a history saved before they existed).

        Args:
            state: what :meth:`state_dict` returned.

        Returns:
            The history.

        Raises:
            TypeError: ``state`` is not a mapping, or an entry has the wrong type.
            ValueError: an entry is missing or does not agree with the others.
        """
        state = _as_dict("state", state)
        missing = {"steps", "attentions", "kinds", "sequences", "layer_sequences"} - set(state)
        if missing:
            raise ArgumentError(f"state is missing {sorted(missing)}")
        return cls(
            steps=state["steps"],
            attentions=state["attentions"],
            kinds=state["kinds"],
            sequences=state["sequences"],
            layer_sequences=state["layer_sequences"],
            projected=state.get("projected", {}),
            effective=state.get("effective", {}),
        )

    def save(self, path: str | Path) -> Path:
        """Write the history with ``torch.save`` (parent folders created).

        The file is replaced only once it is complete.

        Args:
            path: the file to write.

        Returns:
            ``path`` as a ``Path``.

        Raises:
            ValueError: a parent of ``path`` is a file.
            OSError: the file cannot be written (the message names ``path``).
        """
        state = self.state_dict()
        return write_file(path, lambda f: torch.save(state, f))

    @classmethod
    def load(cls, path: str | Path) -> ProbeHistory:
        """Read a history written by :meth:`save` (tensors and plain data only: ``weights_only``).

        Args:
            path: the file.

        Returns:
            The history, checked as :meth:`from_state_dict` checks it.

        Raises:
            TypeError: the file's content is not a history's layout.
            ValueError: an entry is missing or does not agree with the others.
        """
        return cls.from_state_dict(torch.load(Path(path), map_location="cpu", weights_only=True))


def _check_step(name: str, step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        raise ArgumentTypeError(f"{name} must hold ints, got {type(step).__name__}")
    if step < 0:
        raise ArgumentError(f"{name} must be ≥ 0, got {step}")
    return int(step)


def _as_dict(name: str, value: object) -> dict[Any, Any]:
    """``value`` as a ``dict``, when it is a mapping (e.g. a JSON object)."""
    if not isinstance(value, Mapping):
        raise ArgumentTypeError(f"{name} must be a mapping, got {type(value).__name__}")
    return dict(value)


def _as_list(name: str, value: object) -> list[Any]:
    """``value`` as a ``list``, when it is a list-like collection (not a string or a mapping)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ArgumentTypeError(f"{name} must be a list, got {type(value).__name__}")
    return list(value)


def _as_pair(
    name: str, value: object, what: str = "(query, key) pair of sequence names"
) -> tuple[str, str]:
    """``value`` as a pair of strings, e.g. ``(query name, key name)``."""
    pair = _as_list(name, value)
    if len(pair) != 2 or not all(isinstance(x, str) for x in pair):
        raise ArgumentError(f"{name} must be a {what}, got {value!r:.80}")
    return pair[0], pair[1]


_PROJECTED_HINT = (
    "; a layer whose keys are projected (Linformer: T_q × k weights) needs its projection "
    "(projected=cache.projected)"
)


def _rows_sequence(k: int) -> str:
    """The name of the sequence of a projected layer's ``k`` row labels (as the viewer names it)."""
    return f"E·K rows (k = {k})"


def _as_weights(name: str, w: object) -> torch.Tensor:
    if isinstance(w, np.ndarray):
        w = torch.from_numpy(w)
    if not isinstance(w, torch.Tensor):
        raise ArgumentTypeError(
            f"{name} must be a torch.Tensor or numpy.ndarray, got {type(w).__name__}"
        )
    if not w.is_floating_point():
        raise ArgumentTypeError(f"{name} must be floating point, got {w.dtype}")
    return w.detach().to("cpu", torch.float32)


def _check_history(history: object) -> ProbeHistory:
    if not isinstance(history, ProbeHistory):
        raise ArgumentTypeError(f"history must be a ProbeHistory, got {type(history).__name__}")
    if not history.steps or not history.attentions:
        raise ArgumentError("history holds no recorded step; record at least one first")
    return history


def _default_layer(history: ProbeHistory) -> str:
    cross = [n for n in history.attentions if history.kinds.get(n) == "cross"]
    return cross[-1] if cross else list(history.attentions)[-1]
