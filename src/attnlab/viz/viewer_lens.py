"""The viewer's lens panel: what each layer would predict, layers × positions.

:func:`add_lens` puts a :class:`~attnlab.inspect.lens.LensResult` (the logit lens of
:func:`attnlab.inspect.logit_lens`, or the tuned lens: ``logit_lens(..., tuned=lens)``) on the
page as the numbers :meth:`~attnlab.inspect.lens.LensResult.top` and
:meth:`~attnlab.inspect.lens.LensResult.kl_to_final` gave: for every row (``embed``, then after
each block; the last row is the model's own output) and every position, the ``k`` most probable
next tokens with their probabilities, and the KL divergence to the final distribution in bits.
The page computes nothing of its own: it draws a table, the output at the top, each cell the
top token and its probability, coloured by the probability (or by the KL to the last layer);
hovering a cell shows its top ``k``, a click keeps them under the table.

**Page size.** A lens adds ``(L + 1) · T · k`` token ids and probabilities and ``(L + 1) · T``
KL values (for SmolLM2, 31 rows, a 128-token text and ``k = 5``: about 20,000 cells, under a
megabyte); the token texts appear once each. ``k`` is at most :data:`MAX_TOP_K`, ``T`` at most
:data:`MAX_LENS_POSITIONS` (the lens holds every layer's logits over the whole vocabulary
while it runs: 31 × 128 × 49,152 float32 for SmolLM2 is 780 MB; the probabilities and KL are
taken a layer at a time, in float64); more is refused in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnlab._checks import check_positive_int
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.lens import LensResult

if TYPE_CHECKING:
    from attnlab.viz.viewer import ViewerData

__all__ = ["DEFAULT_TOP_K", "MAX_LENS_POSITIONS", "MAX_TOP_K", "LensView", "add_lens", "lens_view"]

#: the alternatives a cell shows on hover, by default
DEFAULT_TOP_K = 5
#: the most alternatives a cell may carry (the page's size grows with it)
MAX_TOP_K = 20
#: the most positions a lens panel shows (see the module docstring)
MAX_LENS_POSITIONS = 128

_NAMES = {"logit": "logit lens", "tuned": "tuned lens"}
_MEANINGS = {
    "logit": "each layer's residual stream through the model's final norm and unembedding "
    "(nostalgebraist 2020)",
    "tuned": "each layer's residual stream through its learned affine translator, then the final "
    "norm and unembedding (Belrose et al. 2023)",
}


@dataclass(frozen=True)
class LensView:
    """One lens as the page shows it.

    Attributes:
        lens: ``"logit"`` or ``"tuned"``.
        label: the switch's button, e.g. ``"logit lens"``.
        meaning: what the rows are (the page's note).
        layers: a label per row: ``"embed"``, then the block that wrote it (``"0"``, ``"1"``, …);
            the last row is the model's output.
        positions: a label per position (the token read there).
        top_ids: the ``k`` most probable next tokens of every row and position, largest first.
        top_probs: their probabilities (float64, as :meth:`LensResult.top` gave them).
        kl_bits: ``KL(p_L ‖ p_l)`` of every row and position, bits (0 in the last row).
        tokens: the text of every token id in ``top_ids``.

    Shape:
        top_ids, top_probs ``(L + 1, T, k)`` nested lists; kl_bits ``(L + 1, T)``.
    """

    lens: str
    label: str
    meaning: str
    layers: list[str]
    positions: list[str]
    top_ids: list[list[list[int]]]
    top_probs: list[list[list[float]]]
    kl_bits: list[list[float]]
    tokens: dict[int, str]

    def to_json(self) -> dict[str, Any]:
        """The lens as the page reads it.

        Returns:
            The attributes; ``tokens`` keyed by the id as a string (JSON's keys).
        """
        out = dataclasses.asdict(self)
        out["tokens"] = {str(i): t for i, t in self.tokens.items()}
        return out


def lens_view(
    lens: LensResult,
    positions: Sequence[str],
    decode: Callable[[int], str],
    *,
    k: int = DEFAULT_TOP_K,
    batch_index: int = 0,
) -> LensView:
    """The page's numbers of one lens: its top ``k`` and KL to the final layer, as
    :meth:`~attnlab.inspect.lens.LensResult.top` and
    :meth:`~attnlab.inspect.lens.LensResult.kl_to_final` give them, one layer at a time.

    Args:
        lens: from :func:`attnlab.inspect.logit_lens` (``tuned=``: the tuned lens).
        positions: a label per position (the tokens read).
        decode: a token id → its text.
        k: the alternatives per cell (1 … :data:`MAX_TOP_K`; default :data:`DEFAULT_TOP_K`).
        batch_index: which sequence of the batch.

    Returns:
        :class:`LensView`.

    Raises:
        ValueError: ``k`` out of range; more than :data:`MAX_LENS_POSITIONS` positions; labels
            not one per position; ``batch_index`` out of range.
        TypeError: ``lens`` is not a :class:`~attnlab.inspect.lens.LensResult`.

    Shape:
        lens.logits ``(L + 1, B, T, vocab)``; ``len(positions) == T``.
    """
    if not isinstance(lens, LensResult):
        raise ArgumentTypeError(f"lens must be a LensResult, got {type(lens).__name__}")
    check_positive_int("k", k)
    if k > MAX_TOP_K:
        raise ArgumentError(f"k must be at most {MAX_TOP_K} (the page holds k per cell), got {k}")
    _, batch, t = lens.logits.shape[:3]
    check_lens_positions(t)
    if len(positions) != t:
        raise ArgumentError(
            f"positions must hold one label per position ({t}), got {len(positions)}"
        )
    if not 0 <= batch_index < batch:
        raise ArgumentError(f"batch_index must be in [0, {batch}), got {batch_index}")
    top_ids: list[list[list[int]]] = []
    top_probs: list[list[list[float]]] = []
    kl: list[list[float]] = []
    final = lens.final[batch_index : batch_index + 1]
    for row, label in enumerate(lens.layers):
        # one row and sequence at a time (LensResult's own top and KL): its float64 softmax
        # over the vocabulary exists for one layer, not for all L + 1 at once
        one = LensResult(
            lens.lens, (label,), lens.logits[row : row + 1, batch_index : batch_index + 1], final
        )
        probs, ids = one.top(k)
        top_ids.append(ids[0, 0].tolist())
        top_probs.append(probs[0, 0].tolist())
        kl.append(one.kl_to_final()[0, 0].tolist())
    tokens = {i: decode(i) for i in sorted({i for row in top_ids for cell in row for i in cell})}
    return LensView(
        lens=lens.lens,
        label=_NAMES.get(lens.lens, lens.lens),
        meaning=_MEANINGS.get(lens.lens, ""),
        layers=list(lens.layers),
        positions=[str(p) for p in positions],
        top_ids=top_ids,
        top_probs=top_probs,
        kl_bits=kl,
        tokens=tokens,
    )


def check_lens_positions(t: int) -> None:
    """Refuse a lens panel over more than :data:`MAX_LENS_POSITIONS` positions, in one line.

    Args:
        t: the positions.

    Raises:
        ValueError: ``t`` over the limit.
    """
    if t > MAX_LENS_POSITIONS:
        raise ArgumentError(
            f"the lens panel shows at most {MAX_LENS_POSITIONS} positions (every layer's logits "
            f"over the vocabulary are computed, the top k of each kept), got {t}; shorten the text"
        )


def add_lens(
    data: ViewerData,
    lens: LensResult,
    positions: Sequence[str],
    decode: Callable[[int], str],
    *,
    k: int = DEFAULT_TOP_K,
    batch_index: int = 0,
) -> ViewerData:
    """``data`` with a lens panel (a second lens adds a switch; one of the same kind replaces it).

    Example::

        lens = attnlab.inspect.logit_lens(model, ids)
        data = add_lens(viewer_data(cache.attentions, tokens=words), lens, words, decode)
        write_viewer(data, "view.html")

    Args:
        data: the page's data.
        lens: from :func:`attnlab.inspect.logit_lens`.
        positions: a label per position.
        decode: a token id → its text.
        k: the alternatives per cell (default :data:`DEFAULT_TOP_K`).
        batch_index: which sequence of the batch.

    Returns:
        A new :class:`~attnlab.viz.viewer.ViewerData`.

    Raises:
        ValueError: see :func:`lens_view`; ``data`` has training steps.

    Shape:
        lens.logits ``(L + 1, B, T, vocab)``.
    """
    if data.steps is not None:
        raise ArgumentError("the lens panel shows one input; data has training steps")
    view = lens_view(lens, positions, decode, k=k, batch_index=batch_index)
    kept = [v for v in data.lenses or [] if v.lens != view.lens]
    return dataclasses.replace(data, lenses=[*kept, view])


def check_lenses(lenses: object) -> None:
    """Check the lens panel's lenses (called by ``ViewerData``).

    Args:
        lenses: ``ViewerData.lenses``.

    Raises:
        TypeError: not a list of :class:`LensView`.
    """
    if not isinstance(lenses, list) or not all(isinstance(v, LensView) for v in lenses):
        raise ArgumentTypeError(f"lenses must be a list of LensView, got {type(lenses).__name__}")
