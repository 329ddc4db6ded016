"""Cross-attention as a word alignment: which source tokens a decoder looked at to write each token.

In an encoder-decoder (Vaswani et al. 2017, §3.2.3) every decoder layer's cross-attention row
``i`` is a distribution over the source positions, ``softmax_j(q_i · k_j / √d)``; Bahdanau et al.
(2015, §5.2.2) drew these rows as a soft alignment between the two sentences.
:func:`alignment_heatmap` draws one such matrix (one head, or the mean over a layer's heads) with
the source tokens on the columns and the written target tokens on the rows, and rings each row's
largest weight (the hard alignment ``argmax_j w[i, j]``).

Token labels in other scripts (Japanese, Chinese, …) need a font that holds their glyphs;
matplotlib's default (DejaVu Sans) has none for kana or kanji. :func:`font_for` finds an installed
font that draws every character of the labels (e.g. ``fonts-noto-cjk`` on Debian, or the IPAex font
that the ``matplotlib-fontja`` package ships) and the figure uses it; when no installed font can,
the characters it lacks are drawn as ``□`` (and named in ``plot.data["missing"]``) instead of
matplotlib's warnings and empty boxes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnlab._checks import shape_str
from attnlab.errors import ArgumentError
from attnlab.viz._draw import ArrayLike, Plot, _draw_matrix, _labels, _new_figure, _to_numpy
from attnlab.viz.fonts import font_for, needs_other_font, warn_missing

__all__ = ["alignment_heatmap"]


def alignment_heatmap(
    weights: ArrayLike,
    *,
    source_tokens: Sequence[str],
    target_tokens: Sequence[str],
    title: str | None = None,
    annotate: bool | None = None,
    mark_argmax: bool = True,
) -> Plot:
    """A cross-attention matrix as an alignment between a source and a target sentence.

    Rows are the target tokens the decoder wrote (row ``i`` is the attention of the position that
    wrote ``target_tokens[i]``), columns the source tokens the encoder read. With several heads
    the drawn matrix is their mean, ``w̄[i, j] = (1/H) Σ_h w[h, i, j]``, whose rows still sum to 1.
    Each row's largest weight is ringed: the hard alignment ``a_i = argmax_j w̄[i, j]``. Labels
    are drawn in a font that holds their characters (see :func:`font_for`).

    Args:
        weights: ``(T, S)`` one head, or ``(H, T, S)`` / ``(1, H, T, S)`` the heads of one layer
            (e.g. ``cache.attentions["decoder.layers.1.cross_attn"]``).
        source_tokens: ``S`` labels of the source positions.
        target_tokens: ``T`` labels of the target rows (what each row wrote).
        title: axes title.
        annotate: write the weights in the cells (default: when at most 12 × 12).
        mark_argmax: ring each row's largest weight. Default ``True``.

    Returns:
        :class:`Plot` with ``data["weights"]`` ``(T, S)`` as drawn (the mean over heads for 3-D
        input), ``data["alignment"]`` ``(T,)`` the column of each row's maximum,
        ``data["source_tokens"]`` / ``data["target_tokens"]`` the labels as drawn, ``data["font"]``
        the font's family name and ``data["missing"]`` the characters it could not draw.

    Raises:
        ValueError: ``weights`` is not 2-, 3- or 4-D (with batch 1), or the labels do not match its
            sides. TypeError: ``weights`` is not a tensor or array.

    Shape:
        - weights: ``(T, S)``, ``(H, T, S)`` or ``(1, H, T, S)``; ``T`` target tokens, ``S``
          source tokens, ``H`` heads.

    Examples:
        >>> with attnlab.inspect.capture(model) as cache:
        ...     model(src, tgt_in)
        >>> alignment_heatmap(cache.attentions["decoder.layers.1.cross_attn"][0],
        ...                   source_tokens=["i", "like", "tea", "."],
        ...                   target_tokens=["私", "は", "お茶", "が", "好き", "。", "<eos>"])
    """
    w = _to_numpy("weights", weights, (2, 3, 4))
    if w.ndim == 4:
        if w.shape[0] != 1:
            raise ArgumentError(
                f"weights must be (T, S), (H, T, S) or (1, H, T, S), got {shape_str(w.shape)}"
            )
        w = w[0]
    matrix = w.mean(axis=0) if w.ndim == 3 else w
    t, s = matrix.shape
    rows = _labels("target_tokens", target_tokens, t)
    cols = _labels("source_tokens", source_tokens, s)
    font = font_for([*rows, *cols, *([title] if title else [])])
    warn_missing(font)
    rows = [font.drawable(x) for x in rows]
    cols = [font.drawable(x) for x in cols]
    alignment = matrix.argmax(axis=1) if s else np.zeros(t, dtype=np.int64)
    width = min(12.0, max(4.0, 0.42 * s + 2.2))
    height = min(12.0, max(3.5, 0.36 * t + 1.6))
    fig = _new_figure(width, height)
    ax = fig.add_subplot()
    annotate = (t <= 12 and s <= 12) if annotate is None else annotate
    # the tick labels get the font they need from _draw_matrix (viz.fonts.fit_labels)
    img = _draw_matrix(ax, matrix, rows, cols, vmax=1.0, annotate=annotate, fontsize=9)
    if mark_argmax and t and s:
        limits = ax.get_xlim(), ax.get_ylim()
        ax.scatter(
            alignment, np.arange(t), s=260, marker="o", facecolors="none", edgecolors="#e8453c",
            linewidths=1.4, label="largest weight of the row",
        )  # fmt: skip
        ax.set_xlim(limits[0])
        ax.set_ylim(limits[1])
    if title:
        text = font.drawable(title)
        ax.set_title(text, fontproperties=font.properties(10) if needs_other_font(text) else None)
    ax.set_xlabel("source (what the encoder read)")
    ax.set_ylabel("target (what the decoder wrote)")
    fig.colorbar(img, ax=ax, shrink=0.8, label="weight")
    return Plot(
        fig,
        {
            "weights": matrix,
            "alignment": alignment,
            "source_tokens": np.array(cols, dtype=str),
            "target_tokens": np.array(rows, dtype=str),
            "font": np.array(font.name),
            "missing": np.array(font.missing, dtype=str),
        },
    )
