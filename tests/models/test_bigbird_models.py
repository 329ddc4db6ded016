"""``attention="bigbird"`` in the model configs (issue 12): the configs, GPT and the
encoder-decoder against the same models run with the dense ``bigbird_mask`` (float64), KV-cache
decoding against the full forward, left padding, generation and capture."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest
import torch

import attnlab as al
from attnlab import GPT, GPTConfig, Transformer, TransformerConfig
from attnlab.inspect import capture
from attnlab.models.config import block_layout, config_from_dict, config_to_dict
from attnlab.models.gpt import GPTSelfAttention
from attnlab.nn.kinds import BigBirdSpec
from attnlab.nn.masks import bigbird_layout, bigbird_mask
from attnlab.nn.multihead import MultiHeadAttention

N = 40  # the models' positions
BIGBIRD = {"attention": "bigbird", "block_size": 6, "num_random_blocks": 1, "bigbird_seed": 3}
LAYOUT = {"block_size": 6, "global_blocks": 1, "window_blocks": 3, "num_random_blocks": 1}


def _gpt(dtype: torch.dtype = torch.float64, **kw: object) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, n_positions=N, n_embd=32, n_layer=2, n_head=4, **kw)
    return GPT(cfg).to(dtype).eval()


def _seq2seq(**kw: object) -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, d_ff=64, max_len=N, dropout=0.0, **kw,
    )  # fmt: skip
    return Transformer(cfg).double().eval()


def _dense(causal: bool, t: int, seed: int = 3) -> torch.Tensor:
    """The dense mask of the first ``t`` positions, from ``bigbird_mask`` over ``N``."""
    return bigbird_mask(N, **LAYOUT, seed=seed, causal=causal)[:t, :t]


def _with_dense_masks(model: torch.nn.Module, layers: dict[str, bool]) -> list:
    """Pre-hooks that add the dense BigBird mask (causal or not) to the named full-attention
    layers' ``mask``; returns the handles."""
    handles = []
    for name, causal in layers.items():

        def pre(mod, args, kwargs, causal=causal):  # type: ignore[no-untyped-def]
            t = args[0].shape[1]
            dense = _dense(causal, t).to(args[0].device)
            kwargs["mask"] = al.masks.combine(kwargs.get("mask"), dense)
            return args, kwargs

        handles.append(model.get_submodule(name).register_forward_pre_hook(pre, with_kwargs=True))
    return handles


# -- configs -----------------------------------------------------------------------------------


def test_defaults_are_bigbird_layouts_and_are_written_out() -> None:
    params = inspect.signature(bigbird_layout).parameters
    spec = BigBirdSpec(block_size=64)
    for name in ("global_blocks", "window_blocks", "num_random_blocks", "seed"):
        assert params[name].default == getattr(spec, name)
    for cfg in (GPTConfig(attention="bigbird", block_size=64), TransformerConfig(
            attention=BigBirdSpec(block_size=64))):  # fmt: skip
        assert cfg.attention == spec
        saved = config_to_dict(cfg)  # the numbers the layout is drawn from are in the file
        assert saved["attention"] == {
            "kind": "bigbird", "block_size": 64, "global_blocks": 1, "window_blocks": 3,
            "num_random_blocks": 2, "seed": 0,
        }  # fmt: skip
        back = config_from_dict(type(cfg), json.loads(json.dumps(saved)))
        assert back == cfg


def test_configs_saved_before_specs_still_load() -> None:
    """A config.json written by the release before attention specs (flat fields) loads into
    the same model config."""
    old = {"kind": "GPTConfig", "vocab_size": 50, "attention": "bigbird", "block_size": 6,
           "global_blocks": 1, "window_blocks": 3, "num_random_blocks": 1, "bigbird_seed": 3}  # fmt: skip
    cfg = config_from_dict(GPTConfig, old)
    assert cfg.attention == BigBirdSpec(block_size=6, num_random_blocks=1, seed=3)
    assert config_from_dict(GPTConfig, config_to_dict(cfg)) == cfg


def test_other_attentions_are_saved_as_before() -> None:
    for cfg in (GPTConfig(attention="sliding", window=4),
                TransformerConfig(attention="linformer", linformer_k=8)):  # fmt: skip
        saved = config_to_dict(cfg)
        assert set(saved["attention"]) <= {"kind", "window", "k"}
    assert config_to_dict(GPTConfig(attention="sliding", window=4))["attention"] == {
        "kind": "sliding",
        "window": 4,
    }
    assert "attention" not in config_to_dict(GPTConfig())  # as before any other kind existed


@pytest.mark.parametrize(
    ("cls", "kw", "error", "match"),
    [
        (GPTConfig, {"attention": "bigbird"}, ValueError, "attention='bigbird' needs block_size"),
        (GPTConfig, {"block_size": 64}, ValueError,
         "block_size applies to attention='bigbird' only, got block_size=64"),
        (TransformerConfig, {"attention": "sliding", "window": 2, "num_random_blocks": 1},
         ValueError, "num_random_blocks applies to attention='bigbird'"),
        (GPTConfig, {"bigbird_seed": 0}, ValueError, "bigbird_seed applies to"),
        (GPTConfig, {**BIGBIRD, "window": 3}, ValueError, "window applies to attention='sliding'"),
        (GPTConfig, {**BIGBIRD, "block_size": 0}, ValueError, "block_size must be a positive int"),
        (GPTConfig, {**BIGBIRD, "window_blocks": 2}, ValueError, "window_blocks must be 0 or odd"),
        (GPTConfig, {**BIGBIRD, "global_blocks": -1}, ValueError, "global_blocks must be >= 0"),
        (TransformerConfig, {**BIGBIRD, "global_blocks": 0, "window_blocks": 0,
                             "num_random_blocks": 0}, ValueError, "needs some visible blocks"),
        (GPTConfig, {**BIGBIRD, "block_size": 6.0}, TypeError,
         "block_size must be an int, got float"),
        (GPTConfig, {**BIGBIRD, "global_blocks": (0, -1)}, TypeError,
         "global_blocks must be an int, got tuple"),
        (GPTConfig, {**BIGBIRD, "bigbird_seed": True}, TypeError, "seed must be an int"),
        (GPTConfig, {**BIGBIRD, "bigbird_seed": 2**70}, ValueError, r"seed must be in \[0, 2\*\*32\)"),
    ],
)  # fmt: skip
def test_bad_bigbird_configs_are_refused(cls, kw, error, match) -> None:
    with pytest.raises(error, match=match):
        cls(**kw)


def test_the_layout_comes_from_the_config() -> None:
    cfg = GPTConfig(n_positions=N, **BIGBIRD)
    layout = block_layout(cfg, causal=True)
    assert layout.seq_len == N and layout.causal and layout.block_size == 6
    assert torch.equal(layout.to_dense(), bigbird_mask(N, **LAYOUT, seed=3, causal=True))
    other_seed = block_layout(dataclasses.replace(cfg, bigbird_seed=4), causal=True)
    assert not torch.equal(other_seed.blocks, layout.blocks)  # the seed draws the random blocks
    with pytest.raises(ValueError, match="attention='bigbird'"):
        block_layout(GPTConfig(), causal=True)
    model = _gpt(**BIGBIRD)
    attns = [block.attn for block in model.transformer.h]
    assert all(type(a) is GPTSelfAttention for a in attns)
    shared = block_layout(model.config, causal=True)
    assert attns[0].block_mask is attns[1].block_mask is shared  # one layout, shared
    assert torch.equal(shared.blocks, layout.blocks)  # the sizes of the model do not draw it
    with pytest.raises(ValueError, match="attention must be 'full' for GPT-2"):
        model.to_hf()


# -- GPT: the dense mask, the KV cache, padding ------------------------------------------------


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("t", [4, 23, 29, N])  # T < b, not a multiple of b, the full length
def test_gpt_equals_the_dense_mask(positions: str, t: int) -> None:
    model = _gpt(positions=positions, num_kv_heads=2, backend="auto", **BIGBIRD)
    ref = _gpt(positions=positions, num_kv_heads=2, backend="math")
    ref.load_state_dict(model.state_dict())
    x = torch.randint(0, 50, (2, t), generator=torch.Generator().manual_seed(t))
    handles = _with_dense_masks(ref, {f"transformer.h.{i}.attn": True for i in range(2)})
    with torch.no_grad():
        got, want = model(x).logits, ref(x).logits
    for h in handles:
        h.remove()
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    if t >= 29:  # these lengths hide some blocks: the pattern changes the logits
        with torch.no_grad():
            assert not torch.allclose(ref(x).logits, got)


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_gpt_kv_cache_steps_equal_the_full_forward(positions: str) -> None:
    model = _gpt(positions=positions, num_kv_heads=2, **BIGBIRD)
    x = torch.randint(0, 50, (2, N), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(2, N)
    with torch.no_grad():
        full = model(x).logits
        parts = [model(x[:, :9], cache=cache).logits]
        parts += [model.decode_step(x[:, i : i + 1], cache)[:, None] for i in range(9, N)]
    assert cache.length == N
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-10, atol=1e-10)


def test_gpt_greedy_generation_equals_the_full_forward() -> None:
    model = _gpt(torch.float32, **BIGBIRD)
    prompt = torch.randint(0, 50, (2, 5))
    out = al.generate(model, prompt, max_new_tokens=30)
    assert out.shape == (2, 35)
    with torch.no_grad():
        for i in range(5, 35):
            assert torch.equal(model(out[:, :i]).logits[:, -1].argmax(-1), out[:, i]), i
    beams = al.generate(model, prompt, max_new_tokens=6, strategy="beam", num_beams=3)
    assert beams.shape[0] == 2


def test_gpt_left_padding_reads_the_layout_at_the_positions() -> None:
    model = _gpt(**BIGBIRD)
    x = torch.randint(1, 50, (2, 33), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 33, dtype=torch.long)
    mask[1, :7] = 0  # row 1: 7 pads, then 26 tokens
    with torch.no_grad():
        padded = model(x, mask).logits
        alone = model(x[1:, 7:]).logits
        torch.testing.assert_close(padded[1, 7:], alone[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(padded[0], model(x[:1]).logits[0], rtol=1e-10, atol=1e-10)
        # with the KV cache, step by step, the same logits
        cache = model.new_cache(2, N)
        parts = [model(x[:, :20], mask[:, :20], cache=cache).logits]
        parts += [model(x[:, i : i + 1], mask[:, : i + 1], cache=cache).logits
                  for i in range(20, 33)]  # fmt: skip
    torch.testing.assert_close(torch.cat(parts, 1), padded, rtol=1e-10, atol=1e-10)
    out = al.generate(model.float(), x[:, 25:], attention_mask=mask[:, 25:] * 0 + 1,
                      max_new_tokens=3)  # fmt: skip
    assert out.shape == (2, 11)


def test_gpt_left_padded_generation_equals_the_row_alone() -> None:
    model = _gpt(torch.float32, **BIGBIRD)
    prompt = torch.randint(1, 50, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :4] = 0
    out = al.generate(model, prompt, attention_mask=mask, max_new_tokens=25)
    alone = al.generate(model, prompt[1:, 4:], max_new_tokens=25)
    assert torch.equal(out[1, 10:], alone[0, 6:])


def test_gpt_trains_with_gradient_checkpointing() -> None:
    model = _gpt(**BIGBIRD).train()
    x = torch.randint(0, 50, (2, 31))
    loss = model(x, labels=x).loss
    (grad,) = torch.autograd.grad(loss, [model.transformer.h[0].attn.c_attn.weight])
    model.gradient_checkpointing = True
    again = model(x, labels=x).loss
    (grad2,) = torch.autograd.grad(again, [model.transformer.h[0].attn.c_attn.weight])
    torch.testing.assert_close(again, loss)
    torch.testing.assert_close(grad2, grad)


# -- the encoder-decoder ------------------------------------------------------------------------


def test_transformer_builds_bidirectional_and_causal_layouts() -> None:
    model = _seq2seq(**BIGBIRD)
    enc, dec = model.encoder.layers[0].self_attn, model.decoder.layers[0].self_attn
    assert type(enc) is MultiHeadAttention and type(dec) is MultiHeadAttention
    assert enc.block_mask is not None and not enc.block_mask.causal
    assert dec.block_mask is not None and dec.block_mask.causal
    assert model.decoder.layers[0].cross_attn.block_mask is None  # cross-attention stays full
    assert enc.block_mask.seq_len == dec.block_mask.seq_len == N


@pytest.mark.parametrize(("s", "t"), [(5, 3), (29, 23), (N, N)])
def test_transformer_equals_the_dense_masks(s: int, t: int) -> None:
    model = _seq2seq(num_kv_heads=2, **BIGBIRD)
    ref = _seq2seq(num_kv_heads=2)
    ref.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(s)
    src, tgt = (
        torch.randint(3, 30, (2, s), generator=gen),
        torch.randint(3, 30, (2, t), generator=gen),
    )
    src[1, s - 2 :] = 0  # padded source
    layers = {f"encoder.layers.{i}.self_attn": False for i in range(2)}
    layers.update({f"decoder.layers.{i}.self_attn": True for i in range(2)})
    handles = _with_dense_masks(ref, layers)
    with torch.no_grad():
        got, want = model(src, tgt).logits, ref(src, tgt).logits
    for h in handles:
        h.remove()
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    if s == N:
        with torch.no_grad():
            assert not torch.allclose(ref(src, tgt).logits, got)


def test_transformer_decoding_with_the_cache_equals_the_full_decode() -> None:
    model = _seq2seq(**BIGBIRD)
    src = torch.randint(3, 30, (2, 17))
    src[1, 12:] = 0
    tgt = torch.randint(3, 30, (2, N))
    with torch.no_grad():
        memory = model.encode(src)
        src_mask = al.masks.padding_mask(src, 0)
        full = model.decode(tgt, memory, src_mask=src_mask).logits
        cache = model.new_cache(2, N)
        parts = [model.decode(tgt[:, :6], memory, src_mask=src_mask, cache=cache).logits]
        parts += [model.decode(tgt[:, i : i + 1], memory, cache=cache).logits
                  for i in range(6, N)]  # fmt: skip
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-10, atol=1e-10)
    out = al.generate(model, src, max_new_tokens=12, eos_token_id=[])
    with torch.no_grad():
        for i in range(1, out.shape[1]):
            logits = model.decode(out[:, :i], memory, src_mask=src_mask).logits[:, -1]
            assert torch.equal(logits.argmax(-1), out[:, i]), i


# -- capture --------------------------------------------------------------------------------------


def test_captured_weights_are_the_dense_mask_weights() -> None:
    model = _gpt(**BIGBIRD)
    ref = _gpt(backend="math")
    ref.load_state_dict(model.state_dict())
    x = torch.randint(0, 50, (2, 35))
    with torch.no_grad():
        plain = model(x).logits
        with capture(model) as cache:
            out = model(x).logits
        handles = _with_dense_masks(ref, {f"transformer.h.{i}.attn": True for i in range(2)})
        with capture(ref) as want:
            ref(x)
    for h in handles:
        h.remove()
    torch.testing.assert_close(out, plain, rtol=0, atol=0)  # capture changes nothing
    dense = _dense(True, 35)
    for name in ("transformer.h.0.attn", "transformer.h.1.attn"):
        w = cache.attentions[name]
        assert w.shape == (2, 4, 35, 35)
        torch.testing.assert_close(w, want.attentions[name], rtol=1e-10, atol=1e-12)
        assert torch.all(w[..., ~dense] == 0) and torch.all(w[..., dense] > 0)
