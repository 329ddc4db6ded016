"""Path patching on a hand-built two-layer model whose paths are known, float64: the receiver's
values read the sender's output exactly and its queries and keys not at all, so the path
through ``v`` is the sender's whole effect and those through ``q`` and ``k`` are 0."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import GPT, GPTConfig
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect import logit_difference, patch_heads, path_patch, path_patch_heads

A, B, FILL, GOOD, BAD = 1, 2, 0, 3, 4
D, HEAD = 8, 4  # d_model, d_head: two heads a layer


def hand_built() -> GPT:
    """Residual dims: e0/e1 the tokens A/B, e7 the filler; layer 0 head 0 (the sender) attends
    uniformly and copies e0 → e2, e1 → e3; layer 1 head 0 (the receiver) scores by the filler
    (e7, never the sender's e2/e3) and copies e2 → e4, e3 → e5; the unembedding reads e4 − e5.
    No MLP, no norms, no positions; every other head is zero."""
    cfg = GPTConfig(
        vocab_size=5, n_positions=8, n_layer=2, n_embd=D, n_head=2, bias=False, mlp="none"
    )
    model = GPT(cfg).double().eval()
    for p in model.parameters():
        p.requires_grad_(False).zero_()
    model.transformer.ln_f = nn.Identity()  # type: ignore[assignment]
    emb = model.transformer.wte.weight
    emb[A, 0] = emb[B, 1] = emb[FILL, 7] = 1.0
    for block in model.transformer.h:
        block.ln_1 = nn.Identity()
    send, recv = model.transformer.h[0].attn, model.transformer.h[1].attn
    wq, wk, wv = send.c_attn.weight.split(D)  # rows: head 0's are [:HEAD]
    wv[0, 0] = wv[1, 1] = 1.0  # v = (x0, x1)
    send.c_proj.weight[2, 0] = send.c_proj.weight[3, 1] = 2.0  # → e2, e3
    wq, wk, wv = recv.c_attn.weight.split(D)
    wq[0, 7] = wk[0, 7] = 1.5  # scores read the filler only
    wv[0, 2] = wv[1, 3] = 1.0
    recv.c_proj.weight[4, 0] = recv.c_proj.weight[5, 1] = 1.0
    model.lm_head.weight = nn.Parameter(torch.zeros(5, D, dtype=torch.float64))
    model.lm_head.weight.data[GOOD, 4] = model.lm_head.weight.data[BAD, 5] = 3.0
    return model


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logit_difference(logits, GOOD, BAD)


CLEAN = torch.tensor([FILL, A, FILL, B, FILL, FILL])
CORRUPTED = torch.tensor([FILL, B, FILL, B, FILL, FILL])


def test_the_known_path() -> None:
    model = hand_built()
    exact = patch_heads(model, CLEAN, CORRUPTED, metric, layers=[0])
    total = exact.patched[0, 0]
    assert abs(total - exact.corrupted) > 0.1
    via = {x: path_patch(model, CLEAN, CORRUPTED, (0, 0), [(1, 0)], metric, via=x) for x in "qkv"}
    assert via["v"].patched == pytest.approx(float(total), abs=1e-12)
    assert via["v"].normalized == pytest.approx(1.0, abs=1e-12)  # the whole effect
    assert via["q"].patched == via["k"].patched == via["q"].corrupted  # nothing, exactly
    # the other head of layer 1 reads nothing; a sender after the receiver reaches nothing
    assert path_patch(model, CLEAN, CORRUPTED, (0, 0), (1, 1), metric).patched == via["q"].corrupted
    assert path_patch(model, CLEAN, CORRUPTED, (1, 1), [(1, 0)], metric).normalized == 0.0
    scan = path_patch_heads(model, CLEAN, CORRUPTED, [(1, 0)], metric, via="v", batch_size=1)
    assert scan.rows == ("0",) and scan.patched.shape == (1, 2)
    assert scan.patched[0, 0] == pytest.approx(via["v"].patched, abs=1e-12)
    assert scan.patched[0, 1] == scan.corrupted
    assert via["v"].to_dict()["sender"] == [0, 0]


def test_grouped_query_receivers_and_batches() -> None:
    """A Llama-like random model: the scan, batched, agrees with one sender at a time; the
    direct effect of a head on its own layer is none."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=13, n_positions=8, n_layer=3, n_embd=24, n_head=4, num_kv_heads=2,
        norm="rmsnorm", positions="rope", bias=False, mlp="gated", activation="silu",
        family="llama",
    )  # fmt: skip
    model = GPT(cfg).double().eval()
    clean = torch.tensor([1, 2, 3, 4, 5])
    corrupted = torch.tensor([1, 7, 3, 4, 5])
    for via in "qkv":
        scan = path_patch_heads(model, clean, corrupted, [(2, 1), (1, 3)], metric, via=via)
        one = path_patch(model, clean, corrupted, (0, 2), [(2, 1), (1, 3)], metric, via=via)
        assert scan.patched.shape == (2, 4)
        assert scan.patched[0, 2] == pytest.approx(one.patched, abs=1e-10)
        assert (scan.patched[1] != scan.corrupted).all()


def test_bad_input() -> None:
    model = hand_built()
    for call, error in (
        (lambda: path_patch(model, CLEAN, CORRUPTED, (0, 5), [(1, 0)], metric), ArgumentError),
        (lambda: path_patch(model, CLEAN, CORRUPTED, (2, 0), [(1, 0)], metric), ArgumentError),
        (lambda: path_patch(model, CLEAN, CORRUPTED, "0.0", [(1, 0)], metric), ArgumentTypeError),
        (lambda: path_patch(model, CLEAN, CORRUPTED, (0, 0), [], metric), ArgumentError),
        (
            lambda: path_patch(model, CLEAN, CORRUPTED, (0, 0), [(1, 0)], metric, via="z"),
            ArgumentError,
        ),
        (lambda: path_patch_heads(model, CLEAN, CORRUPTED, [(0, 1)], metric), ArgumentError),
    ):
        with pytest.raises(error):
            call()


def three_layers(intermediate: bool = True) -> GPT:
    """Every head attends uniformly (its queries and keys are zero), so the model is linear in
    the residual stream. Residual dims (12: two heads of 6 a layer): e0/e1 the tokens A/B; layer
    0 head 0, the sender, copies e0 → e2, e1 → e3; layer 1 head 0, the intermediate head, copies
    e2 → e4, e3 → e5 (with ``intermediate``; else it is zero); layer 2 head 0, the receiver,
    reads e2 + e4 and e3 + e5 through its values and writes e6, e7, which alone the unembedding
    reads. The sender reaches the receiver's values directly (e2, e3) and through the
    intermediate head (e4, e5)."""
    d = 12
    cfg = GPTConfig(vocab_size=5, n_positions=8, n_layer=3, n_embd=d, n_head=2, bias=False,
                    mlp="none")  # fmt: skip
    model = GPT(cfg).double().eval()
    for p in model.parameters():
        p.requires_grad_(False).zero_()
    model.transformer.ln_f = nn.Identity()  # type: ignore[assignment]
    for block in model.transformer.h:
        block.ln_1 = nn.Identity()
    emb = model.transformer.wte.weight
    emb[A, 0] = emb[B, 1] = 1.0
    copies = {0: [(0, 2), (1, 3)], 1: [(2, 4), (3, 5)] if intermediate else []}
    copies[2] = [(2, 6), (4, 6), (3, 7), (5, 7)]
    for layer, pairs in copies.items():
        attn = model.transformer.h[layer].attn
        wv = attn.c_attn.weight[2 * d :]  # the values' rows; head 0's are [:head]
        for src, dst in pairs:
            slot = dst % 2  # value dimension 0 carries the even target, 1 the odd
            wv[slot, src] = 1.0
            attn.c_proj.weight[dst, slot] = 2.0 if layer == 0 else 1.0
    model.lm_head.weight = nn.Parameter(torch.zeros(5, d, dtype=torch.float64))
    model.lm_head.weight.data[GOOD, 6] = model.lm_head.weight.data[BAD, 7] = 3.0
    return model


def test_every_other_head_is_frozen() -> None:
    """Wang et al. 2022: the sender's change reaches the receiver only directly; the heads
    between them keep their corrupted outputs. Here the sender's whole effect runs through the
    receiver's values, directly and through the intermediate head, so a path patch that let the
    intermediate head recompute would give the whole effect, not the direct part: the sender's
    total effect in the same model without the intermediate head."""
    model = three_layers()
    exact = patch_heads(model, CLEAN, CORRUPTED, metric, layers=[0])
    total = float(exact.patched[0, 0]) - exact.corrupted
    # the direct effect: the sender's whole effect once the intermediate head is gone (linear)
    alone = patch_heads(three_layers(intermediate=False), CLEAN, CORRUPTED, metric, layers=[0])
    direct = float(alone.patched[0, 0]) - alone.corrupted
    path = path_patch(model, CLEAN, CORRUPTED, (0, 0), [(2, 0)], metric, via="v")
    assert path.corrupted == exact.corrupted
    assert abs(total - direct) > 0.5 and abs(direct) > 0.5
    assert path.patched - path.corrupted == pytest.approx(direct, abs=1e-12)
    # the scan agrees, and the intermediate head's own path is the rest: direct + indirect =
    # total
    scan = path_patch_heads(model, CLEAN, CORRUPTED, [(2, 0)], metric, via="v")
    assert scan.patched[0, 0] == pytest.approx(path.patched, abs=1e-12)
    indirect = float(scan.patched[1, 0]) - scan.corrupted
    assert indirect == pytest.approx(total - direct, abs=1e-12)
