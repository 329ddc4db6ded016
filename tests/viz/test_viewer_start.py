"""Where the viewer opens (:func:`attnlab.viz.viewer_start.most_informative_head`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.inspect.diagnostics import diagnose
from attnlab.viz.viewer import ViewerData, viewer_data
from attnlab.viz.viewer_start import ViewerStart, most_informative_head


def _soft(logits: torch.Tensor, causal: bool = False) -> torch.Tensor:
    if causal:
        t = logits.shape[-1]
        keep = torch.ones(t, t, dtype=torch.bool).tril()
        logits = logits.masked_fill(~keep, float("-inf"))
    return torch.softmax(logits, -1)


def _gpt(t: int = 8, heads: int = 4) -> dict[str, torch.Tensor]:
    """Two layers of small random logits (blurry heads), causal."""
    g = torch.Generator().manual_seed(0)
    return {
        f"transformer.h.{i}.attn": _soft(torch.randn(1, heads, t, t, generator=g) * 0.3, True)
        for i in range(2)
    }


def test_gpt_picks_the_sharp_head_not_the_sink() -> None:
    t = 8
    w = _gpt(t)
    sink = torch.full((t, t), -30.0)
    sink[:, 0] = 30.0
    w["transformer.h.0.attn"][0, 1] = _soft(sink, True)  # everything on the first token: entropy 0
    prev = torch.full((t, t), -30.0)
    prev[torch.arange(1, t), torch.arange(t - 1)] = 30.0  # the previous token
    prev[0, 0] = 30.0
    w["transformer.h.1.attn"][0, 2] = _soft(prev, True)
    data = viewer_data(w, tokens=list("abcdefgh"))
    start = most_informative_head(data)
    assert (start.group, start.layer, start.head) == (0, 1, 2)
    assert "lowest-entropy head" in start.reason and "sink" in start.reason
    # without the sharp head, the sink is still passed over: the lowest-entropy blurry head wins
    w["transformer.h.1.attn"][0, 2] = w["transformer.h.1.attn"][0, 3]
    start = most_informative_head(viewer_data(w, tokens=list("abcdefgh")))
    assert (start.layer, start.head) != (0, 1)
    # the test can fail: the sink is the lowest-entropy head of all
    heads = diagnose({k: v.clone() for k, v in w.items()}).heads
    lowest = min(heads, key=lambda h: h.entropy_mean)
    assert (lowest.layer, lowest.head) == ("transformer.h.0.attn", 1)


def test_seq2seq_opens_on_the_sharpest_cross_attention_head() -> None:
    g = torch.Generator().manual_seed(1)
    sharp_self = _soft(torch.randn(1, 2, 6, 6, generator=g) * 50)  # sharper than any cross head
    cross = [_soft(torch.randn(1, 2, 5, 6, generator=g)) for _ in range(2)]
    cross[1][0, 1] = _soft(torch.eye(5, 6)[:, torch.randperm(6, generator=g)] * 20)
    w = {
        "encoder.layers.0.self_attn": sharp_self,
        "decoder.layers.0.self_attn": _soft(torch.randn(1, 2, 5, 5, generator=g), True),
        "decoder.layers.0.cross_attn": cross[0],
        "decoder.layers.1.self_attn": _soft(torch.randn(1, 2, 5, 5, generator=g), True),
        "decoder.layers.1.cross_attn": cross[1],
    }
    data = viewer_data(w, source=list("abcdef"), target=list("vwxyz"))
    start = most_informative_head(data)
    assert data.groups[start.group].name == "decoder cross-attention"
    assert data.groups[start.group].layers[start.layer].name == "decoder.layers.1.cross_attn"
    assert start.head == 1 and "cross-attention head" in start.reason
    assert data.to_json()["start"] == start.to_json()


def test_every_head_a_sink_falls_back_to_the_lowest_entropy() -> None:
    t = 6

    def on_first(share: float) -> torch.Tensor:  # (T, T): share on key 0, the rest spread evenly
        w = torch.full((t, t), (1 - share) / (t - 1))
        w[:, 0] = share
        return w

    w = torch.stack([on_first(0.6), on_first(1.0), on_first(0.7)])[None]
    start = most_informative_head(viewer_data({"transformer.h.0.attn": w}, tokens=list("abcdef")))
    assert (start.layer, start.head) == (0, 1) and "left out" not in start.reason


def test_with_steps_the_last_step_decides() -> None:
    t, steps = 5, [0, 10]
    w = np.full((2, 3, t, t), 1.0 / t, dtype=np.float32)  # uniform everywhere
    w[1, 2] = np.eye(t, dtype=np.float32)[::-1]  # at the last step head 2 is sharp
    from attnlab.viz.viewer import AttentionGroup, AttentionLayer

    group = AttentionGroup("self-attention", "tokens", "tokens", [AttentionLayer("l0", w)])
    data = ViewerData("t", {"tokens": list("abcde")}, [group], steps=steps)
    assert most_informative_head(data).head == 2


def test_a_given_start_is_checked_and_kept() -> None:
    w = _gpt()
    data = viewer_data(w, tokens=list("abcdefgh"))
    kept = ViewerData(data.title, data.sequences, data.groups, start=ViewerStart(0, 1, 3, "mine"))
    assert kept.to_json()["start"] == {"group": 0, "layer": 1, "head": 3, "reason": "mine"}
    for bad, msg in (
        (ViewerStart(1, 0, 0), r"start.group must be in \[0, 1\), got 1"),
        (ViewerStart(0, 2, 0), r"start.layer must be in \[0, 2\), got 2"),
        (ViewerStart(0, 0, 4), r"start.head must be in \[0, 4\), got 4"),
    ):
        with pytest.raises(ValueError, match=msg):
            ViewerData(data.title, data.sequences, data.groups, start=bad)
    with pytest.raises(TypeError, match="start must be a ViewerStart, got tuple"):
        ViewerData(data.title, data.sequences, data.groups, start=(0, 0, 0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"sink_share must lie in \(0, 1\], got 0"):
        most_informative_head(data, sink_share=0)
    with pytest.raises(TypeError, match="sink_share must be a float"):
        most_informative_head(data, sink_share="0.5")  # type: ignore[arg-type]


def test_a_sink_as_diagnose_calls_it_is_left_out_whatever_sink_share() -> None:
    """One rule for sinks: a head `inspect` reports as SINK (every row ≥ 0.99 on the first key)
    is never the opening head, even when its mean share is below ``sink_share``."""
    t = 8
    w = _gpt(t, heads=2)
    logits = torch.zeros(t, t)
    logits[:, 0] = 12.0  # all but ~1e-4 of every row on key 0: mean share < 1
    w["transformer.h.0.attn"][0, 0] = _soft(logits, True)
    heads = diagnose({k: v.clone() for k, v in w.items()}).heads
    assert heads[0].status == "sink" and heads[0].first_token_share < 1.0
    assert min(heads, key=lambda h: h.entropy_mean) is heads[0]  # the test can fail
    start = most_informative_head(viewer_data(w, tokens=list("abcdefgh")), sink_share=1.0)
    assert (start.layer, start.head) != (0, 0) and "sink" in start.reason
