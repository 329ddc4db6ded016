"""attnlab.inspect.ablation: masked_heads, head_importance, pruning_curve (Michel et al. 2019).

The fast tests use tiny random models; the last ones train an encoder-decoder on the reverse task
and check that heads removed by importance behave as the paper says.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import torch

import attnlab as al
from attnlab.data.batching import Seq2SeqBatch, make_seq2seq_batch, pad_batch
from attnlab.data.toy_sequences import SequenceTask, SequenceTaskConfig
from attnlab.decoding.layout import lay_out_for_decoding
from attnlab.inspect import head_importance, masked_heads, pruning_curve, pruning_order
from tests.decoding._models import greedy_without_cache

H = 4


def tiny_gpt(**overrides: object) -> al.GPT:
    cfg = {"vocab_size": 40, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": H}
    return al.GPT(al.GPTConfig(**{**cfg, **overrides})).eval()  # type: ignore[arg-type]


def tiny_seq2seq(**overrides: object) -> al.Transformer:
    kwargs: dict = dict(
        src_vocab_size=20, tgt_vocab_size=20, d_model=32, num_heads=H, num_encoder_layers=2,
        num_decoder_layers=2, d_ff=64, dropout=0.0, max_len=32,
    )  # fmt: skip
    kwargs.update(overrides)
    return al.Transformer(al.TransformerConfig(**kwargs)).eval()


def seq2seq_batches(n: int = 2) -> list[Seq2SeqBatch]:
    out = []
    for _ in range(n):
        src = [
            torch.randint(3, 20, (int(torch.randint(2, 7, ()).item()),)).tolist() for _ in range(4)
        ]
        out.append(make_seq2seq_batch(src, [s[::-1] for s in src], pad_id=0, bos_id=1, eos_id=2))
    return out


ENC_DEC_LAYERS = [
    "encoder.layers.0.self_attn", "encoder.layers.1.self_attn",
    "decoder.layers.0.self_attn", "decoder.layers.0.cross_attn",
    "decoder.layers.1.self_attn", "decoder.layers.1.cross_attn",
]  # fmt: skip


# ------------------------------------------------------------------ masked_heads


def test_masked_heads_equals_the_models_head_mask_arguments() -> None:
    gpt = tiny_gpt()
    ids = torch.randint(0, 40, (2, 9))
    xi = torch.tensor([1.0, 0.0, 0.0, 1.0])
    with masked_heads(gpt, {"transformer.h.1.attn": xi}):
        got = gpt(ids).logits
    want = gpt(ids, head_mask=torch.stack([torch.ones(H), xi])).logits
    assert torch.equal(got, want)
    assert not torch.equal(got, gpt(ids).logits)

    model = tiny_seq2seq()
    b = seq2seq_batches(1)[0]
    masks = {"decoder.layers.1.cross_attn": xi, "encoder.layers.0.self_attn": 1 - xi}
    with masked_heads(model, masks):
        got = model(b.src, b.tgt_in).logits
    ones = torch.ones(2, H)
    want = model(
        b.src, b.tgt_in, head_mask=torch.stack([1 - xi, torch.ones(H)]),
        decoder_head_mask=ones, cross_attn_head_mask=torch.stack([torch.ones(H), xi]),
    ).logits  # fmt: skip
    assert torch.equal(got, want)


def test_masked_heads_multiplies_a_mask_the_call_already_has() -> None:
    gpt = tiny_gpt()
    ids = torch.randint(0, 40, (2, 9))
    a, b = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([1.0, 1.0, 0.5, 0.0])
    with masked_heads(gpt, {"transformer.h.0.attn": a, "transformer.h.1.attn": a}):
        got = gpt(ids, head_mask=b).logits
    assert torch.equal(got, gpt(ids, head_mask=(a * b).expand(2, H)).logits)


def test_masked_heads_removes_its_hooks_on_exit_and_on_error() -> None:
    gpt = lay_out_for_decoding(tiny_gpt())  # the strides generate() gives the weights
    ids = torch.randint(0, 40, (1, 5))
    plain = gpt(ids).logits
    off = torch.ones(2, H)
    off[0] = 0.0
    with masked_heads(gpt, {"transformer.h.0.attn": torch.zeros(H)}):
        # generate() runs the one forward, hooks and all: the head stays off in every step
        want = al.generate(gpt, ids, max_new_tokens=4)
    assert torch.equal(want, greedy_without_cache(gpt, ids, 4, head_mask=off))
    with pytest.raises(RuntimeError, match="boom"):
        with masked_heads(gpt, {"transformer.h.0.attn": torch.zeros(H)}):
            raise RuntimeError("boom")
    assert all(not m._forward_pre_hooks for m in gpt.modules())
    assert all("head_ablations" not in m.__dict__ for m in gpt.modules())  # no state left
    assert torch.equal(gpt(ids).logits, plain)


def test_masked_heads_refuses_bad_masks() -> None:
    gpt = tiny_gpt()
    with pytest.raises(ValueError, match=r"'transformer.h.7.attn'.*known: 'transformer.h.0.attn', 'transformer.h.1.attn'"):  # fmt: skip
        with masked_heads(gpt, {"transformer.h.7.attn": torch.ones(H)}):
            pass
    bad = [
        (torch.ones(3), ValueError, r"masks\['transformer.h.0.attn'\] must have shape \(H,\) = \(4,\), got \(3,\)"),
        (torch.ones(2, H), ValueError, r"must have shape \(H,\) = \(4,\), got \(2, 4\)"),
        (torch.ones(H, dtype=torch.long), TypeError, "must be floating .* got dtype torch.int64"),
        (torch.tensor([1.0, float("nan"), 1.0, 1.0]), ValueError, "must be finite"),
        ([1.0, 0.0, 1.0, 1.0], TypeError, "must be a torch.Tensor, got list"),
    ]  # fmt: skip
    for mask, error, words in bad:
        with pytest.raises(error, match=words):
            with masked_heads(gpt, {"transformer.h.0.attn": mask}):
                pass
    with pytest.raises(TypeError, match="masks must map attention module paths"):
        with masked_heads(gpt, [torch.ones(H)]):  # type: ignore[arg-type]
            pass
    assert all(not m._forward_pre_hooks for m in gpt.modules())


def test_generate_with_kv_cache_under_masked_heads_equals_full_recomputation() -> None:
    gpt = tiny_gpt()
    with torch.no_grad():  # GPT-2's init (std 0.02) leaves attention too faint to change tokens
        for block in gpt.transformer.h:
            block.attn.c_attn.weight.mul_(20)
            block.attn.c_proj.weight.mul_(50)
    prompt = torch.randint(0, 40, (2, 4))
    xi = torch.tensor([0.0, 1.0, 1.0, 0.0])
    with masked_heads(gpt, {"transformer.h.0.attn": xi}):
        got = al.generate(gpt, prompt, max_new_tokens=6)
    ids = prompt
    head_mask = torch.stack([xi, torch.ones(H)])
    for _ in range(6):  # greedy, recomputing the whole sequence each step, no cache
        nxt = gpt(ids, head_mask=head_mask).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
    assert torch.equal(got, ids)
    assert not torch.equal(al.generate(gpt, prompt, max_new_tokens=6), ids)

    model = tiny_seq2seq(tie_output=False)  # tied, a random model only repeats <bos>
    src = torch.randint(3, 20, (3, 6))
    masks = {"decoder.layers.0.cross_attn": xi, "decoder.layers.1.self_attn": 1 - xi}
    with masked_heads(model, masks):
        got = al.generate(model, src, max_new_tokens=5, eos_token_id=[])
    ys = torch.full((3, 1), model.config.bos_id)
    ones = torch.ones(H)
    for _ in range(5):
        logits = model(
            src, ys, decoder_head_mask=torch.stack([ones, 1 - xi]),
            cross_attn_head_mask=torch.stack([xi, ones]),
        ).logits  # fmt: skip
        ys = torch.cat([ys, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(got, ys)
    assert not torch.equal(al.generate(model, src, max_new_tokens=5, eos_token_id=[]), ys)


# ------------------------------------------------------------------ head_importance


def test_head_importance_of_an_encoder_decoder() -> None:
    model = tiny_seq2seq(dropout=0.3).train()
    model.decoder.norm.eval()  # a submodule in another mode: its own flag comes back
    batches = seq2seq_batches(3)
    imp = head_importance(model, iter(batches), normalize=False)  # a one-pass iterable is fine
    assert model.training and model.encoder.layers[0].training and not model.decoder.norm.training
    assert all(p.grad is None for p in model.parameters())
    assert imp.layers == tuple(ENC_DEC_LAYERS)
    assert imp.kinds == ("self", "self", "self", "cross", "self", "cross")
    assert imp.ablation.shape == imp.gradient.shape == (6, H) and imp.num_batches == 3

    model.eval()
    with torch.no_grad():
        losses = [model(b.src, b.tgt_in, targets=b.targets).loss for b in batches]
        assert imp.base_loss == pytest.approx(float(torch.stack(losses).mean()), abs=1e-6)
        # ablation of head 2 of decoder layer 1's cross-attention, by the model's own argument
        xi = torch.ones(2, H)
        xi[1, 2] = 0.0
        cut = [
            model(b.src, b.tgt_in, targets=b.targets, cross_attn_head_mask=xi).loss for b in batches
        ]
    want = float(torch.stack(cut).mean()) - imp.base_loss
    assert float(imp.ablation[5, 2]) == pytest.approx(want, abs=1e-6)

    # gradient: E over batches of |∂L/∂ξ| at ξ = 1, by the model's own head-mask arguments
    total = torch.zeros(3, 2, H, dtype=torch.float64)
    for b in batches:
        m = torch.ones(3, 2, H, requires_grad=True)
        loss = model(
            b.src, b.tgt_in, targets=b.targets, head_mask=m[0], decoder_head_mask=m[1],
            cross_attn_head_mask=m[2],
        ).loss  # fmt: skip
        (g,) = torch.autograd.grad(loss, m)
        total += g.abs().double()
    total /= len(batches)
    want_grad = torch.stack(
        [total[0, 0], total[0, 1], total[1, 0], total[2, 0], total[1, 1], total[2, 1]]
    )
    torch.testing.assert_close(imp.gradient, want_grad, atol=1e-7, rtol=1e-5)

    normed = head_importance(model, batches)
    assert normed.normalized and not imp.normalized
    torch.testing.assert_close(normed.gradient.norm(dim=1), torch.ones(6, dtype=torch.float64))
    torch.testing.assert_close(normed.ablation, imp.ablation, atol=1e-6, rtol=0)


def test_head_importance_order_masks_and_dict() -> None:
    gpt = tiny_gpt(dropout=0.1)
    ids = [torch.randint(0, 40, (2, 10)) for _ in range(2)]
    imp = head_importance(gpt, ids)
    assert imp.layers == ("transformer.h.0.attn", "transformer.h.1.attn")
    assert imp.kinds == ("self", "self") and imp.num_heads == H
    for by in ("ablation", "gradient"):
        order = imp.order(by)  # type: ignore[arg-type]
        assert sorted(order) == sorted(imp.heads()) and len(order) == 2 * H
        scores = [float(imp.scores(by)[imp.layers.index(p), h]) for p, h in order]  # type: ignore[arg-type]
        assert scores == sorted(scores)  # least important first
    masks = imp.masks([("transformer.h.1.attn", 2), ("transformer.h.1.attn", 0)])
    assert list(masks) == ["transformer.h.1.attn"]
    assert masks["transformer.h.1.attn"].tolist() == [0.0, 1.0, 0.0, 1.0]
    data = json.loads(json.dumps(imp.to_dict()))
    assert data["layers"] == list(imp.layers) and len(data["ablation"]) == 2
    assert data["normalized"] is True and data["base_loss"] == imp.base_loss
    with pytest.raises(ValueError, match="by must be 'ablation' or 'gradient'"):
        imp.order("entropy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pruned has head 4 for 'transformer.h.0.attn', which must lie in \[0, 4\)"):  # fmt: skip
        imp.masks([("transformer.h.0.attn", 4)])


def test_head_importance_default_losses_and_errors() -> None:
    gpt = tiny_gpt()
    ids = torch.randint(0, 40, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :3] = 0
    by_tensor = head_importance(gpt, [ids])
    by_dict = head_importance(gpt, [{"input_ids": ids}])
    assert by_dict.base_loss == by_tensor.base_loss
    labels = ids.masked_fill(mask == 0, -100)
    padded = head_importance(gpt, [{"input_ids": ids, "attention_mask": mask}])
    with torch.no_grad():
        want = float(gpt(ids, mask, labels=labels).loss)
    assert padded.base_loss == pytest.approx(want, abs=1e-6)

    # any module with attention layers, with a loss_fn
    mha = al.MultiHeadAttention(16, 2).eval()
    x = [torch.randn(2, 5, 16) for _ in range(2)]
    imp = head_importance(mha, x, lambda m, b: m(b, is_causal=True).pow(2).mean())
    assert imp.layers == ("",) and imp.ablation.shape == (1, 2)

    with pytest.raises(TypeError, match="loss_fn must be given for a MultiHeadAttention"):
        head_importance(mha, x)
    with pytest.raises(ValueError, match="batches must hold at least one batch"):
        head_importance(gpt, [])
    with pytest.raises(TypeError, match="batches must be an iterable of batches"):
        head_importance(gpt, ids)
    with pytest.raises(ValueError, match=r"loss_fn must return a scalar tensor, got shape \(2, 5, 16\)"):  # fmt: skip
        head_importance(mha, x, lambda m, b: m(b))
    with pytest.raises(TypeError, match=r"batches must have \.src, \.tgt_in and \.targets"):
        head_importance(tiny_seq2seq(), [ids])
    with pytest.raises(TypeError, match=r"batches must be .* token-id tensors, or have input_ids"):
        head_importance(gpt, [[1, 2, 3]])
    assert all(not m._forward_pre_hooks for m in gpt.modules())


# ------------------------------------------------------------------ pruning_curve


def test_pruning_curve_follows_the_order_cumulatively() -> None:
    model = tiny_seq2seq()
    batches = seq2seq_batches(2)
    imp = head_importance(model, batches)
    order = imp.order("gradient")
    seen: list[int] = []

    def metric(m: torch.nn.Module) -> float:
        # called inside the masks: count the heads it finds switched off
        seen.append(sum(len(getattr(mod, "head_ablations", ())) for mod in m.modules()))
        return float(len(seen))

    curve = pruning_curve(model, batches, order, metric=metric, max_heads=5)
    assert curve.num_pruned == (0, 1, 2, 3, 4, 5) and curve.order == tuple(order[:5])
    assert curve.total_heads == 24 and curve.metric == (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    assert seen[0] == 0 and seen[-1] >= 1
    assert curve.loss[0] == pytest.approx(imp.base_loss, abs=1e-7)
    with masked_heads(model, imp.masks(order[:3])), torch.no_grad():
        want = sum(float(model(b.src, b.tgt_in, targets=b.targets).loss) for b in batches) / 2
    assert curve.loss[3] == pytest.approx(want, abs=1e-6)
    (path, head) = order[0]
    layer = imp.layers.index(path)
    assert curve.loss[1] - curve.loss[0] == pytest.approx(
        float(imp.ablation[layer, head]), abs=1e-6
    )
    data = json.loads(json.dumps(curve.to_dict()))
    assert data["order"][0] == [path, head] and len(data["loss"]) == 6

    full = pruning_curve(model, batches, order)
    assert len(full.loss) == 25 and full.metric is None
    with pytest.raises(ValueError, match=r"order names 'decoder\.layers\.9\.cross_attn'"):
        pruning_curve(model, batches, [("decoder.layers.9.cross_attn", 0)])
    with pytest.raises(ValueError, match=r"which must lie in \[0, 4\)"):
        pruning_curve(model, batches, [("decoder.layers.0.cross_attn", 4)])
    with pytest.raises(ValueError, match="twice"):
        pruning_curve(model, batches, [order[0], order[0]])
    with pytest.raises(TypeError, match=r"order must hold \(layer path, head\) pairs"):
        pruning_curve(model, batches, ["decoder.layers.0.cross_attn"])  # type: ignore[list-item]


def test_head_importance_with_heads_already_pruned() -> None:
    model = tiny_seq2seq()
    batches = seq2seq_batches(2)
    gone = [("decoder.layers.0.cross_attn", 1), ("encoder.layers.1.self_attn", 3)]
    imp = head_importance(model, batches, pruned=gone)
    assert imp.pruned == tuple(gone)
    assert bool(imp.ablation[3, 1].isnan()) and bool(imp.gradient[1, 3].isnan())
    assert int(imp.ablation.isnan().sum()) == int(imp.gradient.isnan().sum()) == 2
    assert len(imp.order()) == len(imp.order("gradient")) == 22
    assert not set(gone) & set(imp.order())
    with masked_heads(model, imp.masks(gone)), torch.no_grad():
        base = sum(float(model(b.src, b.tgt_in, targets=b.targets).loss) for b in batches) / 2
        cut = imp.masks([*gone, ("decoder.layers.1.self_attn", 0)])
    assert imp.base_loss == pytest.approx(base, abs=1e-6)
    with masked_heads(model, cut), torch.no_grad():
        loss = sum(float(model(b.src, b.tgt_in, targets=b.targets).loss) for b in batches) / 2
    assert float(imp.ablation[4, 0]) == pytest.approx(loss - base, abs=1e-6)
    data = json.loads(json.dumps(imp.to_dict()))
    assert data["ablation"][3][1] is None and data["pruned"] == [list(h) for h in gone]
    with pytest.raises(
        ValueError, match=r"pruned names head 1 of 'decoder\.layers\.0\.cross_attn' twice"
    ):
        head_importance(model, batches, pruned=[gone[0], gone[0]])


@pytest.mark.parametrize("by", ["ablation", "gradient"])
def test_pruning_order_estimates_again_after_each_step(by: str) -> None:
    model = tiny_seq2seq()
    batches = seq2seq_batches(2)
    one_shot = head_importance(model, batches).order(by)  # type: ignore[arg-type]
    # one step covering every head: the one-shot order
    assert pruning_order(model, batches, by=by, heads_per_step=24) == one_shot  # type: ignore[arg-type]
    order = pruning_order(model, batches, by=by, heads_per_step=2, max_heads=5)  # type: ignore[arg-type]
    assert len(order) == 5 and order[:2] == one_shot[:2]
    again = head_importance(model, batches, pruned=order[:2]).order(by)  # type: ignore[arg-type]
    assert order[2:4] == again[:2]
    full = pruning_order(model, batches, by=by, heads_per_step=7)  # type: ignore[arg-type]
    assert sorted(full) == sorted(one_shot) and pruning_order(model, batches, max_heads=0) == []
    with pytest.raises(ValueError, match="heads_per_step must be a positive int, got 0"):
        pruning_order(model, batches, heads_per_step=0)
    with pytest.raises(ValueError, match="by must be 'ablation' or 'gradient', got 'loss'"):
        pruning_order(model, batches, by="loss")  # type: ignore[arg-type]


# ------------------------------------------------------------------ the reverse task


REVERSE_TASK = SequenceTaskConfig("reverse", num_symbols=8, min_len=1, max_len=6, num_heldout=200)
STEPS, BATCH, DROPHEAD, HEADS = 900, 32, 0.3, 8


def exact_match(model: al.Transformer, task: SequenceTask) -> float:
    """Greedy decoding (KV cache) of the held-out strings; the fraction reversed exactly."""
    tok = task.tokenizer
    sources = task.heldout()
    src = pad_batch([task.model_input(s) for s in sources], tok.pad_id)  # type: ignore[arg-type]
    out = al.generate(model, src, max_new_tokens=task.max_target_len)
    hits = 0
    for row, s in zip(out.tolist(), sources):
        pred = []
        for t in row[1:]:
            if t == tok.eos_id:
                break
            pred.append(t)
        hits += pred == task.target(s)
    return hits / len(sources)


def train_reverse(task: SequenceTask) -> al.Transformer:
    """A 2 + 2 layer encoder-decoder (d_model 32, 8 heads of 4 dims, d_ff 64) trained on reverse
    with Adam (lr 3e-3, 50 warm-up steps, then linear decay), 900 steps of 32 strings, and DropHead
    (Zhou et al. 2020) with p = 0.3: every step switches each head off with probability 0.3 through
    the model's own head masks, the kept heads scaled by 1/(1 − p). Trained without DropHead the
    same way, the model loses 15–20 points of exact match without half of its heads."""
    torch.manual_seed(0)
    tok = task.tokenizer
    cfg = al.TransformerConfig(
        src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=32,
        num_heads=HEADS, num_encoder_layers=2, num_decoder_layers=2, d_ff=64, dropout=0.0,
        label_smoothing=0.0, share_embeddings=True, max_len=REVERSE_TASK.max_len + 2,
        pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id,
    )  # type: ignore[arg-type]  # fmt: skip
    model = al.Transformer(cfg).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / STEPS)
    )
    drop = torch.Generator().manual_seed(0)

    def keep() -> torch.Tensor:  # (layers, heads): DropHead, rescaled
        return (torch.rand(2, HEADS, generator=drop) > DROPHEAD).float() / (1 - DROPHEAD)

    for step in range(STEPS):
        b = task.batch(step, BATCH)
        loss = model(
            b.src, b.tgt_in, targets=b.targets, head_mask=keep(), decoder_head_mask=keep(),
            cross_attn_head_mask=keep(),
        ).loss  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    return model.eval()


@pytest.mark.slow
def test_reverse_task_heads() -> None:
    """Michel et al. on a trained model: without its cross-attention the model cannot reverse
    anything; without the least important half of its heads (ablation, estimated again after
    every 4 heads) it still reverses almost every held-out string (measured: 100% → 94.5%);
    without the other half, almost none (0% here, 6% under another BLAS's rounding).

    One test (not a module fixture) so that the training runs once under pytest-xdist."""
    task = SequenceTask(REVERSE_TASK, seed=0)
    model = train_reverse(task)
    full = exact_match(model, task)
    assert full >= 0.95

    def without(heads: Sequence[tuple[str, int]]) -> float:
        with masked_heads(model, importance.masks(heads)):
            return exact_match(model, task)

    # importance on a batch of 128 strings never trained on (a step past the end)
    batches = [task.batch(10_000, 128)]
    importance = head_importance(model, batches)
    cross = [p for p, k in zip(importance.layers, importance.kinds) if k == "cross"]
    no_cross = without([(p, h) for p in cross for h in range(HEADS)])
    assert len(cross) == 2 and no_cross <= 0.02, f"without cross-attention: {no_cross:.3f}"

    half = len(importance.heads()) // 2
    order = pruning_order(model, batches, heads_per_step=4, max_heads=half)
    assert len(order) == half == 24
    least = without(order)
    rest = [h for h in importance.heads() if h not in order]
    most = without(rest)
    summary = f"full {full:.3f}, without the least important half {least:.3f}, the rest {most:.3f}"
    assert least >= full - 0.1, summary
    # "almost none": a trained model's outcome, so its last digits follow the BLAS's rounding
    # during training (the rest 0.000 on an Intel Xeon, 0.060 under MKL_CBWR=COMPATIBLE, the
    # code path of an AMD EPYC); the claim is the contrast, not one machine's number
    assert most <= 0.1 and least - most >= 0.8, summary
    assert model.training is False and all(not m._forward_pre_hooks for m in model.modules())

    # plausibility (attnlab.inspect.plausibility): on reverse each output token's source is
    # known; every method points at it more often than a random alignment (measured on 64
    # held-out strings: cross-attention weights 0.569, ALTI+ 0.580, random 0.340 top-1)
    from attnlab.inspect.plausibility import plausibility

    held_out = task.batch(10_001, 64)
    rows = {
        r.method: r
        for r in plausibility(
            model, held_out.src, held_out.tgt_in, held_out.targets,
            ignore_ids=[task.tokenizer.pad_id, task.tokenizer.eos_id],
        )
    }  # fmt: skip
    assert rows["random"].top1 + 0.1 < min(rows["weights"].top1, rows["alti"].top1), rows
    assert rows["random"].f1 + 0.1 < min(rows["weights"].f1, rows["alti"].f1), rows
