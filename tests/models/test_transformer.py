"""The encoder-decoder Transformer: config, equations, masks, loss, KV cache, hooks, autocast."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import attnlab as al
from attnlab import masks
from attnlab.models.config import config_from_dict, config_to_dict
from attnlab.nn.hooks import HookPoint
from attnlab.nn.positional import sinusoidal_table
from tests.nn.test_layers import ref_decoder_layer, ref_encoder_layer, ref_layer_norm
from tests.reference import assert_close_rule

PAD, BOS, EOS, V = 0, 1, 2, 23


def tiny(**overrides: object) -> al.TransformerConfig:
    kwargs: dict = dict(
        src_vocab_size=V,
        tgt_vocab_size=V + 4,
        d_model=16,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_ff=32,
        dropout=0.0,
        max_len=64,
    )
    kwargs.update(overrides)
    return al.TransformerConfig(**kwargs)


def model_of(**overrides: object) -> al.Transformer:
    return al.Transformer(tiny(**overrides)).eval()


def tokens(*rows: list[int]) -> torch.Tensor:
    return torch.tensor(rows)


SRC = tokens([5, 6, 7, 8, 9, 10], [11, 12, 13, PAD, PAD, PAD])
TGT = tokens([BOS, 3, 4, 5, 6], [BOS, 7, 8, PAD, PAD])


# ---------------------------------------------------------------- config


def test_config_defaults_are_the_base_model() -> None:
    c = al.TransformerConfig()
    assert (c.d_model, c.num_heads, c.d_ff) == (512, 8, 2048)
    assert (c.num_encoder_layers, c.num_decoder_layers) == (6, 6)
    assert (c.dropout, c.label_smoothing, c.norm_first, c.activation) == (0.1, 0.1, False, "relu")
    assert c.d_head == 64 and c.kv_heads == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 256  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "error", "field"),
    [
        ({"d_model": 30, "num_heads": 8}, ValueError, "d_model"),
        ({"num_kv_heads": 3}, ValueError, "num_kv_heads"),
        ({"num_heads": 0}, ValueError, "num_heads"),
        ({"d_ff": -1}, ValueError, "d_ff"),
        ({"src_vocab_size": 0}, ValueError, "src_vocab_size"),
        ({"num_decoder_layers": 2.0}, TypeError, "num_decoder_layers"),
        ({"dropout": 1.5}, ValueError, "dropout"),
        ({"attention_dropout": -0.1}, ValueError, "attention_dropout"),
        ({"label_smoothing": 1.0}, ValueError, "label_smoothing"),
        ({"activation": "tanh"}, ValueError, "activation"),
        ({"backend": "cuda"}, ValueError, "backend"),
        ({"norm_first": "yes"}, TypeError, "norm_first"),
        ({"layer_norm_eps": 0.0}, ValueError, "layer_norm_eps"),
        ({"max_len": 0}, ValueError, "max_len"),
        ({"pad_id": 99}, ValueError, "pad_id"),
        ({"eos_id": -1}, ValueError, "eos_id"),
        ({"bos_id": 0}, ValueError, "bos_id"),
        ({"share_embeddings": True}, ValueError, "share_embeddings"),
    ],
)
def test_config_errors_name_the_field(overrides: dict, error: type, field: str) -> None:
    with pytest.raises(error, match=field):
        tiny(**overrides)


def test_config_round_trips_through_a_dict() -> None:
    c = tiny(norm_first=True, num_kv_heads=2, activation="gelu")
    assert config_from_dict(al.TransformerConfig, config_to_dict(c)) == c


def test_model_refuses_a_wrong_config() -> None:
    with pytest.raises(TypeError, match="config"):
        al.Transformer({"d_model": 16})  # type: ignore[arg-type]


# ---------------------------------------------------------------- the equations


def ref_forward(
    model: al.Transformer, src: torch.Tensor, tgt_in: torch.Tensor, dt: torch.dtype
) -> torch.Tensor:
    """The whole model written from the paper with the model's weights, in dtype ``dt``."""
    c = model.config
    pe = sinusoidal_table(c.max_len, c.d_model).to(dt)
    src_mask, tgt_mask = masks.padding_mask(src, c.pad_id), masks.padding_mask(tgt_in, c.pad_id)
    # §3.4, §3.5: Embedding · √d_model + PE
    x = model.src_embed.weight.detach().to(dt)[src] * math.sqrt(c.d_model) + pe[: src.shape[1]]
    for layer in model.encoder.layers:
        x = ref_encoder_layer(layer, x, src_mask, dt)
    if c.norm_first:
        x = ref_layer_norm(model.encoder.norm, x, dt)
    memory = x
    y = (
        model.tgt_embed.weight.detach().to(dt)[tgt_in] * math.sqrt(c.d_model)
        + pe[: tgt_in.shape[1]]
    )
    for layer in model.decoder.layers:
        y = ref_decoder_layer(layer, y, memory, tgt_mask, src_mask, dt)
    if c.norm_first:
        y = ref_layer_norm(model.decoder.norm, y, dt)
    return y @ model.lm_head.weight.detach().to(dt).T


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_forward_matches_reference(norm_first: bool, num_kv_heads: int | None) -> None:
    model = model_of(norm_first=norm_first, num_kv_heads=num_kv_heads)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
        logits = model(SRC, TGT).logits
        real = TGT != PAD  # padded query rows are not compared (they see only earlier keys anyway)
        assert_close_rule(
            logits[real],
            ref_forward(model, SRC, TGT, torch.float64)[real],
            ref_forward(model, SRC, TGT, torch.float32)[real],
        )


def test_shapes_and_output_type() -> None:
    model = model_of()
    memory = model.encode(SRC)
    assert memory.shape == (2, 6, 16)
    out = model.decode(TGT, memory, src_mask=masks.padding_mask(SRC, PAD))
    assert isinstance(out, al.models.outputs.Seq2SeqOutput)
    assert out.logits.shape == (2, 5, V + 4) and out.loss is None and out.cache is None
    out = model(SRC, TGT[:, :-1], targets=TGT[:, 1:])
    assert out.logits.shape == (2, 4, V + 4) and out.loss is not None and out.loss.dim() == 0


def test_embeddings_are_scaled_and_positioned() -> None:
    model = model_of()
    seen = {}
    model.hook_src_embed.register_forward_hook(lambda m, a, o: seen.__setitem__("x", o))
    model.encode(SRC)
    want = model.src_embed.weight[SRC] * 4.0 + sinusoidal_table(64, 16)[:6]  # √16 = 4
    torch.testing.assert_close(seen["x"], want)


def test_shared_and_tied_weights() -> None:
    shared = model_of(tgt_vocab_size=V, share_embeddings=True, tie_output=True)
    assert shared.src_embed.weight is shared.tgt_embed.weight is shared.lm_head.weight
    separate = model_of(tgt_vocab_size=V, tie_output=False)
    assert separate.src_embed.weight is not separate.tgt_embed.weight
    assert separate.lm_head.weight is not separate.tgt_embed.weight
    n_shared = sum(p.numel() for p in shared.parameters())
    n_separate = sum(p.numel() for p in separate.parameters())
    assert n_separate - n_shared == 2 * V * 16  # one matrix instead of three


# ---------------------------------------------------------------- masks from pad_id


def test_masks_are_derived_from_pad_id() -> None:
    model = model_of()
    default = model(SRC, TGT).logits
    explicit = model(
        SRC, TGT, src_mask=masks.padding_mask(SRC, PAD), tgt_mask=masks.padding_mask(TGT, PAD)
    ).logits
    torch.testing.assert_close(default, explicit)
    # without the source padding mask the padded row would read the padding: the mask matters
    everything = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    unmasked = model(SRC, TGT, src_mask=everything).logits
    assert (unmasked[1] - default[1]).abs().max() > 1e-4
    torch.testing.assert_close(unmasked[0], default[0])


def test_padding_the_source_leaves_logits_unchanged() -> None:
    model = model_of(norm_first=True)
    longer = torch.cat([SRC, torch.full((2, 5), PAD)], dim=1)
    a = model(SRC, TGT).logits
    b = model(longer, TGT).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # and each row equals the row run alone without its padding
    alone = model(SRC[1:, :3], TGT[1:]).logits
    torch.testing.assert_close(a[1:], alone, atol=1e-5, rtol=1e-5)


def test_right_padded_targets_do_not_change_real_positions() -> None:
    model = model_of()
    a = model(SRC[1:], TGT[1:]).logits  # [BOS, 7, 8, PAD, PAD]
    b = model(SRC[1:], TGT[1:, :3]).logits
    torch.testing.assert_close(a[:, :3], b, atol=1e-5, rtol=1e-5)


def test_look_ahead_mask() -> None:
    model = model_of()
    a = model(SRC, TGT).logits
    changed = TGT.clone()
    changed[:, 3] = 9
    b = model(SRC, changed).logits
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert (a[0, 3:] - b[0, 3:]).abs().max() > 1e-4


# ---------------------------------------------------------------- loss (§5.4)


def test_loss_is_label_smoothed_cross_entropy_ignoring_pad() -> None:
    model = model_of(label_smoothing=0.1)
    tgt_in, targets = TGT[:, :-1], TGT[:, 1:]  # row 1 has padding among the targets
    out = model(SRC, tgt_in, targets=targets)
    want = F.cross_entropy(
        out.logits.reshape(-1, V + 4), targets.reshape(-1), ignore_index=PAD, label_smoothing=0.1
    )
    torch.testing.assert_close(out.loss, want)
    # by hand, in float64: (1 − ε)·(−log p_y) + ε·mean_v(−log p_v), averaged over non-pad targets
    logp = out.logits.double().log_softmax(-1)
    nll = -logp.gather(-1, targets[..., None]).squeeze(-1)
    smooth = -logp.mean(-1)
    per_token = 0.9 * nll + 0.1 * smooth
    keep = targets != PAD
    torch.testing.assert_close(out.loss.double(), per_token[keep].mean(), atol=1e-6, rtol=1e-6)
    assert keep.sum() < keep.numel()  # the example really has padding
    assert abs((per_token.mean() - per_token[keep].mean()).item()) > 1e-4


def test_loss_without_smoothing_and_shape_error() -> None:
    model = model_of(label_smoothing=0.0)
    out = model(SRC, TGT[:, :-1], targets=TGT[:, 1:])
    want = F.cross_entropy(out.logits.reshape(-1, V + 4), TGT[:, 1:].reshape(-1), ignore_index=PAD)
    torch.testing.assert_close(out.loss, want)
    with pytest.raises(ValueError, match="targets"):
        model(SRC, TGT[:, :-1], targets=TGT)


def test_training_reduces_the_loss() -> None:
    model = al.Transformer(tiny(dropout=0.1, label_smoothing=0.0)).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        loss = model(SRC, TGT[:, :-1], targets=TGT[:, 1:]).loss
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.4 * first


# ---------------------------------------------------------------- KV cache


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("num_kv_heads", [None, 1])
def test_cached_decoding_equals_full_decode_at_every_step(
    norm_first: bool, num_kv_heads: int | None
) -> None:
    model = model_of(norm_first=norm_first, num_kv_heads=num_kv_heads)
    src_mask = masks.padding_mask(SRC, PAD)
    tgt = tokens([BOS, 3, 4, 5, 6, 7, 8], [BOS, 9, 10, 11, 12, 13, 14])
    with torch.no_grad():
        memory = model.encode(SRC)
        cache = model.new_cache(2, 8, src_len=SRC.shape[1])
        for t in range(tgt.shape[1]):
            step = model.decode(tgt[:, t : t + 1], memory, src_mask=src_mask, cache=cache)
            full = model.decode(tgt[:, : t + 1], memory, src_mask=src_mask)
            assert step.cache is cache and cache.length == t + 1
            torch.testing.assert_close(step.logits[:, 0], full.logits[:, -1], atol=1e-5, rtol=1e-5)
        for c in cache.cross or []:
            assert isinstance(c, al.CrossKVCache) and c.filled and c.length == SRC.shape[1]


def test_cache_remembers_src_mask_and_takes_chunks() -> None:
    """A prompt chunk then single steps; the src mask is given on the first step only."""
    model = model_of()
    src_mask = masks.padding_mask(SRC, PAD)
    with torch.no_grad():
        memory = model.encode(SRC)
        full = model.decode(TGT, memory, src_mask=src_mask).logits
        cache = model.new_cache(2, 5)  # cross caches sized by config.max_len
        a = model.decode(TGT[:, :3], memory, src_mask=src_mask, cache=cache).logits
        b = model.decode(TGT[:, 3:4], memory, cache=cache).logits
        c = model.decode(TGT[:, 4:], memory, cache=cache).logits
    torch.testing.assert_close(torch.cat([a, b, c], 1), full, atol=1e-5, rtol=1e-5)


def test_cache_reorder_selects_rows() -> None:
    model = model_of()
    with torch.no_grad():
        memory = model.encode(SRC)
        src_mask = masks.padding_mask(SRC, PAD)
        cache = model.new_cache(2, 5)
        model.decode(TGT[:, :2], memory, src_mask=src_mask, cache=cache)
        index = torch.tensor([1, 1])
        cache.reorder(index)
        got = model.decode(TGT[index, 2:3], memory[index], cache=cache).logits
        want = model.decode(TGT[index, :3], memory[index], src_mask=src_mask[index]).logits
    torch.testing.assert_close(got[:, 0], want[:, -1], atol=1e-5, rtol=1e-5)


def test_cache_capacity_and_position_limits() -> None:
    model = model_of(max_len=8)
    memory = model.encode(SRC)
    cache = model.new_cache(2, 3)
    model.decode(TGT[:, :3], memory, cache=cache)
    with pytest.raises(ValueError, match="capacity"):
        model.decode(TGT[:, 3:4], memory, cache=cache)
    with pytest.raises(ValueError, match="max_len"):
        model.encode(torch.full((1, 9), 5))


def test_bad_tokens_are_refused() -> None:
    model = model_of()
    with pytest.raises(ValueError, match="src_vocab_size"):
        model.encode(torch.tensor([[V]]))
    with pytest.raises(ValueError, match="tgt_vocab_size"):
        model(SRC, torch.tensor([[BOS, V + 4], [BOS, 3]]))
    with pytest.raises(TypeError, match="src"):
        model.encode(torch.ones(1, 3))
    with pytest.raises(ValueError, match="memory"):
        model.decode(TGT, torch.zeros(2, 6, 8))


# ---------------------------------------------------------------- hooks and autocast


def test_hooks_do_not_change_outputs() -> None:
    model = model_of()
    before = model(SRC, TGT).logits
    seen: dict[str, torch.Tensor] = {}
    handles = [
        m.register_forward_hook(lambda mod, a, o, name=name: seen.__setitem__(name, o))
        for name, m in model.named_modules()
        if isinstance(m, HookPoint)
    ]
    after = model(SRC, TGT).logits
    for h in handles:
        h.remove()
    torch.testing.assert_close(after, before, atol=1e-6, rtol=1e-6)
    cross = seen["decoder.layers.1.cross_attn.hook_weights"]
    assert cross.shape == (2, 4, 5, 6)
    assert torch.all(cross[1, ..., 3:] == 0)  # padded source positions get no weight
    assert seen["encoder.layers.0.self_attn.hook_weights"].shape == (2, 4, 6, 6)
    torch.testing.assert_close(seen["hook_memory"], model.encode(SRC))


def test_bf16_autocast_runs() -> None:
    model = al.Transformer(tiny(dropout=0.1)).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(SRC, TGT[:, :-1], targets=TGT[:, 1:])
    assert out.logits.dtype == torch.bfloat16
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())

    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        memory = model.encode(SRC)
        src_mask = masks.padding_mask(SRC, PAD)
        cache = model.new_cache(2, 5)
        assert cache.layers[0].k.dtype == torch.bfloat16
        steps = [
            model.decode(TGT[:, t : t + 1], memory, src_mask=src_mask, cache=cache).logits
            for t in range(5)
        ]
        full = model.decode(TGT, memory, src_mask=src_mask).logits
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=5e-2, rtol=5e-2)


# ---------------------------------------------------------------- gradient checkpointing


def _loss_and_grads(
    model: al.Transformer, **head_masks: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    torch.manual_seed(1)  # the same dropout masks in both runs
    loss = model(SRC, TGT[:, :-1], targets=TGT[:, 1:], **head_masks).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}  # type: ignore[union-attr]


@pytest.mark.parametrize("norm_first", [False, True])
def test_gradient_checkpointing_gives_identical_loss_and_gradients(norm_first: bool) -> None:
    """Bit-identical: the recomputed forward replays the same operations on the same inputs
    with the same dropout masks (the RNG state is saved and restored), so every gradient equals
    the plain run's exactly — checked with torch.equal, no tolerance."""
    model = al.Transformer(
        tiny(dropout=0.2, attention_dropout=0.1, norm_first=norm_first, num_kv_heads=2)
    ).train()
    assert model.gradient_checkpointing is False
    loss, grads = _loss_and_grads(model)
    model.gradient_checkpointing = True  # settable after construction (as the CLI does)
    assert model.encoder.gradient_checkpointing and model.decoder.gradient_checkpointing
    calls = []
    handle = model.encoder.layers[0].register_forward_pre_hook(lambda *a: calls.append(1))
    ckpt_loss, ckpt_grads = _loss_and_grads(model)
    handle.remove()
    assert len(calls) == 2  # forward, then recomputed in backward: checkpointing did happen
    assert torch.equal(ckpt_loss, loss)
    assert grads.keys() == ckpt_grads.keys()
    for name in grads:
        assert torch.equal(ckpt_grads[name], grads[name]), name
    assert all(g.abs().sum() > 0 for n, g in grads.items() if "norm" not in n or norm_first)


def test_gradient_checkpointing_with_head_masks_and_its_switches() -> None:
    model = al.Transformer(tiny(dropout=0.1, gradient_checkpointing=True)).train()
    assert model.gradient_checkpointing is True
    masks_ = {
        "head_mask": torch.tensor([1.0, 0.0, 1.0, 1.0]),
        "decoder_head_mask": torch.rand(2, 4),
        "cross_attn_head_mask": torch.tensor([0.0, 1.0, 1.0, 1.0]),
    }
    loss, grads = _loss_and_grads(model, **masks_)
    model.gradient_checkpointing = False
    plain_loss, plain_grads = _loss_and_grads(model, **masks_)
    assert torch.equal(loss, plain_loss)
    for name in grads:
        assert torch.equal(grads[name], plain_grads[name]), name
    # only while training with grad enabled, and never with a KV cache
    model.gradient_checkpointing = True
    calls = []
    model.decoder.layers[0].register_forward_pre_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        model(SRC, TGT[:, :-1])
    model.eval()
    model(SRC, TGT[:, :-1]).logits.sum().backward()
    model.train()
    cache = model.new_cache(2, 8)
    model.decode(TGT[:, :2], model.encode(SRC), cache=cache).logits.sum().backward()
    assert len(calls) == 3
    with pytest.raises(TypeError, match="gradient_checkpointing must be a bool, got int"):
        model.gradient_checkpointing = 1  # type: ignore[assignment]


def test_gradient_checkpointing_config_field() -> None:
    assert al.TransformerConfig().gradient_checkpointing is False
    with pytest.raises(TypeError, match="gradient_checkpointing must be a bool"):
        tiny(gradient_checkpointing="yes")
    c = tiny(gradient_checkpointing=True)
    assert config_from_dict(al.TransformerConfig, config_to_dict(c)) == c
