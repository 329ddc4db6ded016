"""The head's card of ``attnlab serve``: what attnlab already measures of one head, through the
same library calls as the command line (the page adds no numerics of its own).

* its role scores — previous-token, duplicate-token, induction, copying — from
  :func:`attnlab.inspect.roles.head_roles` on random repeated tokens with ``attnlab inspect
  --roles``' defaults (:data:`ROLES_SEQ_LEN` tokens a copy, :data:`ROLES_BATCH` sequences, seed
  0, no BOS, the tokenizer's special ids avoided); measured once per model;
* its entropy, sink share (weight on the first token) and status on the text, from
  :func:`attnlab.inspect.diagnose` of the text's capture (``attnlab inspect --text``' table);
* its QK and OV spectra from :func:`attnlab.inspect.qk_circuits.qk_spectrum` (``attnlab inspect
  --qk-spectrum``; weights only, once per model);
* the chosen query's row of the context-mixing methods of :data:`CARD_METHODS`, as the viewer's
  method switch shows them (:func:`attnlab.viz.viewer_mixing.mixing_views`, ``attnlab view
  --mixing``): ``norm`` per head, ``alti`` through the layers up to this one;
* the chosen position's column of the logit lens as the viewer's lens panel holds it
  (:func:`attnlab.inspect.logit_lens` and :func:`attnlab.viz.viewer_lens.lens_view`,
  ``attnlab view --lens logit``): each layer's top tokens, their probabilities and the KL to the
  output.

What depends on the text alone (capture, mixing, lens) is kept in the session's bounded cache,
keyed by the token ids: choosing another head or query of the same text runs nothing again. The
mixing and the lens cost seconds on a new text of a pretrained model (SmolLM2-135M, 14 tokens:
about 3 s and 5 s of CPU — the lens is every layer's logits over the vocabulary): the page asks
for them (``parts``) only when their box is ticked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from attnlab.inspect.diagnostics import diagnose
from attnlab.inspect.lens import logit_lens
from attnlab.inspect.qk_circuits import CircuitSpectrum, qk_spectrum
from attnlab.inspect.roles import ROLES, HeadRoles, head_roles, ordinary_token_range
from attnlab.models.gpt import GPT
from attnlab.tasks.base import special_ids
from attnlab.viz.viewer_lens import LensView, lens_view
from attnlab.viz.viewer_mixing import MixingView, mixing_views

if TYPE_CHECKING:
    import numpy as np

    from attnlab.serve.session import Session

__all__ = [
    "CARD_METHODS",
    "CARD_PARTS",
    "LENS_TOP_K",
    "ROLES_BATCH",
    "ROLES_SEQ_LEN",
    "head_card",
    "roles_of",
]

#: ``attnlab inspect --roles``' defaults: random tokens a copy, sequences averaged over
ROLES_SEQ_LEN = 50
ROLES_BATCH = 8
#: the context-mixing methods on the card (one per head, one rolled out through the layers)
CARD_METHODS = ("norm", "alti")
#: the lens's alternatives per layer on the card
LENS_TOP_K = 5
#: what a card holds; a request may ask for some of them
CARD_PARTS = ("roles", "health", "spectrum", "mixing", "lens")


def roles_of(model: torch.nn.Module, tokenizer: Any) -> HeadRoles | None:
    """The role scores ``attnlab inspect --roles`` prints for ``model`` (its defaults; the random
    sequence shortened to half the context, or to the ordinary tokens of a tiny vocabulary,
    where that is shorter).

    Args:
        model: the served model.
        tokenizer: its tokenizer (its special ids are avoided), or ``None``.

    Returns:
        :class:`~attnlab.inspect.roles.HeadRoles`, or ``None`` for a model that is not an
        :class:`attnlab.GPT` (role scores are measured on a decoder-only model).
    """
    if not isinstance(model, GPT):
        return None
    vocab = model.config.vocab_size
    lo, hi = ordinary_token_range(vocab, special_ids(tokenizer))
    return head_roles(
        model,
        seq_len=min(ROLES_SEQ_LEN, model.config.n_positions // 2, hi - lo),
        batch=ROLES_BATCH,
        seed=0,
        token_range=(lo, hi),
    )


def _number(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _row(a: np.ndarray | torch.Tensor) -> list[float | None]:
    return [_number(float(v)) for v in a.tolist()]


def head_card(
    session: Session,
    ids: Sequence[int],
    layer: int,
    head: int,
    query: int,
    parts: Sequence[str] = CARD_PARTS,
) -> dict[str, Any]:
    """Everything the card shows of one head (see the module docstring).

    Args:
        session: the server's session (its model, tokenizer and cache).
        ids: the tokens.
        layer: index into the session's attention layers.
        head: the query head.
        query: the position whose mixing row and lens column are shown.
        parts: which of :data:`CARD_PARTS` to compute (the others are ``null``).

    Returns:
        ``layer`` (its path), ``head``, ``query``, ``tokens``; ``roles`` (``{role: score}``,
        with ``convention``, ``seq_len``, ``batch``; ``null`` for a model without role scores);
        ``health`` (:meth:`~attnlab.inspect.diagnostics.HeadHealth.to_dict`); ``spectrum``
        (``qk`` and ``ov`` singular values, effective and numerical ranks, ``d_head``);
        ``mixing`` (per method: ``name``, ``label``, ``meaning``, ``scope``, ``note``, ``row``
        over the keys); ``lens`` (``label``, ``meaning``, and per layer ``layer``, ``top``
        ``[{id, token, probability}]``, ``kl_bits``), ``null`` for values JSON has not.
    """
    path = session.layers[layer]
    key = tuple(ids)
    x = torch.tensor([list(ids)], dtype=torch.long, device=next(session.model.parameters()).device)
    card: dict[str, Any] = {"layer": path, "head": head, "query": query,
                            "tokens": session.labels(ids)}  # fmt: skip
    card.update(dict.fromkeys(CARD_PARTS))
    if "roles" in parts:
        roles = session.remember(("roles",), lambda: roles_of(session.model, session.io.tokenizer))
        card["roles"] = _roles(roles, path, head)
    if "health" in parts:
        report = session.remember(("health", key), lambda: diagnose(session.captured(ids)))
        card["health"] = report.for_layer(path)[head].to_dict()
    if "spectrum" in parts:
        spectrum = session.remember(("spectrum",), lambda: qk_spectrum(session.model))
        card["spectrum"] = _spectrum(spectrum, layer, head)
    if "mixing" in parts:
        views, values = session.remember(
            ("mixing", key), lambda: mixing_views(session.model, x, CARD_METHODS)
        )
        card["mixing"] = [_mixing(v, values[path][v.name], head, query) for v in views]
    if "lens" in parts:
        lens: LensView = session.remember(
            ("lens", key),
            lambda: lens_view(
                logit_lens(session.model, x), session.labels(ids),
                lambda i: session.labels([i])[0], k=LENS_TOP_K,
            ),
        )  # fmt: skip
        card["lens"] = _lens(lens, query)
    return card


def _roles(roles: HeadRoles | None, path: str, head: int) -> dict[str, Any] | None:
    if roles is None:
        return None
    i = roles.layers.index(path)
    scores = {name: _number(float(roles.score(name)[i, head])) for name in ROLES}
    return {**scores, "convention": roles.convention, "seq_len": roles.seq_len,
            "batch": int(roles.tokens.shape[0])}  # fmt: skip


def _spectrum(spec: CircuitSpectrum, layer: int, head: int) -> dict[str, Any]:
    out: dict[str, Any] = {"d_head": spec.d_head}
    for c in ("qk", "ov"):
        out[c] = _row(spec.values(c)[layer, head])
        out[f"{c}_effective_rank"] = _number(float(spec.effective_rank(c)[layer, head]))
        out[f"{c}_rank"] = int(spec.rank(c)[layer, head])
    return out


def _mixing(view: MixingView, matrices: np.ndarray, head: int, query: int) -> dict[str, Any]:
    """One method's row for the query: the head's own matrix, or the layer's one."""
    matrix = matrices[head] if view.scope == "head" else matrices[0]
    return {**view.to_json(), "row": _row(matrix[query])}


def _lens(view: LensView, query: int) -> dict[str, Any]:
    rows = [
        {
            "layer": name,
            "top": [
                {"id": i, "token": view.tokens[i], "probability": p}
                for i, p in zip(view.top_ids[r][query], view.top_probs[r][query])
            ],
            "kl_bits": _number(view.kl_bits[r][query]),
        }
        for r, name in enumerate(view.layers)
    ]
    return {"label": view.label, "meaning": view.meaning, "position": query, "rows": rows}
