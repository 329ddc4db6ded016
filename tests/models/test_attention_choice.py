"""The attention a model config chooses (issue 12): configs, models, decoding, capture, viewer."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import attnlab as al
from attnlab import GPT, GPTConfig, Transformer, TransformerConfig
from attnlab.inspect import capture, run_with_cache
from attnlab.models.config import config_from_dict, config_to_dict
from attnlab.models.gpt import GPTPerformerAttention, GPTSelfAttention, RecomputeCache
from attnlab.nn.kv_cache import PerformerState
from attnlab.nn.linformer import LinformerAttention
from attnlab.nn.masks import sliding_window_mask
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.performer import PerformerAttention
from attnlab.viz.viewer import render_viewer, viewer_data

GPT_KINDS = {
    "full": {},
    "sliding": {"attention": "sliding", "window": 3},
    "performer": {"attention": "performer", "num_features": 16},
}
SEQ2SEQ_KINDS = {
    **GPT_KINDS,
    "sliding": {"attention": "sliding", "window": 2},
    "linformer": {"attention": "linformer", "linformer_k": 4},
}


def _gpt(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=4, **kw)
    return GPT(cfg).eval()


def _seq2seq(**kw) -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, d_ff=64, max_len=24, dropout=0.0, **kw,
    )  # fmt: skip
    return Transformer(cfg).eval()


# -- configs -----------------------------------------------------------------------------------


def test_default_is_full_and_old_config_json_loads_as_full(tmp_path) -> None:
    for cls, kw in ((GPTConfig, {}), (TransformerConfig, {})):
        cfg = cls(**kw)
        assert cfg.attention == al.nn.kinds.FullSpec() and cfg.attention.name == "full"
        old = config_to_dict(cfg)
        # full attention is written as before the fields existed (resumed runs compare equal)
        assert not {"attention", "window", "linformer_k", "num_features"} & set(old)
        path = tmp_path / f"{cls.__name__}.json"
        path.write_text(json.dumps(old))
        assert config_from_dict(cls, json.loads(path.read_text())) == cfg


@pytest.mark.parametrize("kind", list(SEQ2SEQ_KINDS))
def test_configs_round_trip(kind: str) -> None:
    cfg = TransformerConfig(**SEQ2SEQ_KINDS[kind])
    if kind != "full":
        assert config_to_dict(cfg)["attention"]["kind"] == kind
    assert config_from_dict(TransformerConfig, json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    if kind != "linformer":
        g = GPTConfig(**GPT_KINDS[kind])
        assert config_from_dict(GPTConfig, config_to_dict(g)) == g


@pytest.mark.parametrize(
    ("cls", "kw", "match"),
    [
        (GPTConfig, {"attention": "linformer", "linformer_k": 8}, "cannot be causal"),
        (GPTConfig, {"attention": "bigbird"}, "attention='bigbird' needs block_size"),
        (TransformerConfig, {"attention": "nope"}, "attention must be one of"),
        (GPTConfig, {"window": 8}, "window applies to attention='sliding' only"),
        (TransformerConfig, {"attention": "sliding"}, "needs window"),
        (TransformerConfig, {"attention": "linformer"}, "linformer' needs k"),
        (TransformerConfig, {"linformer_k": 4}, "linformer_k applies to"),
        (GPTConfig, {"attention": "sliding", "window": 4, "num_features": 8}, "num_features"),
        (GPTConfig, {"attention": "sliding", "window": 0}, "window"),
        (GPTConfig, {"attention": "performer", "positions": "rope"}, "positions='learned'"),
        (GPTConfig, {"attention": "performer", "positions": "alibi"}, "positions='learned'"),
    ],
)
def test_bad_combinations_are_refused(cls, kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        cls(**kw)


def test_non_int_parameter_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="window must be an int"):
        GPTConfig(attention="sliding", window=2.5)


# -- models build the chosen attention ---------------------------------------------------------


def test_gpt_builds_the_chosen_layers() -> None:
    assert type(_gpt().transformer.h[0].attn) is GPTSelfAttention
    sliding = _gpt(**GPT_KINDS["sliding"]).transformer.h[0].attn
    assert isinstance(sliding, GPTSelfAttention) and sliding.window == (3, 0)
    perf = _gpt(**GPT_KINDS["performer"]).transformer.h[0].attn
    assert isinstance(perf, GPTPerformerAttention) and isinstance(perf, PerformerAttention)
    assert perf.num_features == 16 and perf.causal
    names = {n for n, _ in _gpt(**GPT_KINDS["performer"]).named_parameters()}
    assert names == {n for n, _ in _gpt().named_parameters()}  # GPT-2's names: c_attn, c_proj


def test_transformer_builds_the_chosen_layers() -> None:
    m = _seq2seq(**SEQ2SEQ_KINDS["sliding"])
    assert m.encoder.layers[0].self_attn.window == (2, 2)  # symmetric in the encoder
    assert m.decoder.layers[0].self_attn.window == (2, 0)  # causal in the decoder
    assert m.decoder.layers[0].cross_attn.window is None
    m = _seq2seq(**SEQ2SEQ_KINDS["linformer"])
    assert isinstance(m.encoder.layers[0].self_attn, LinformerAttention)
    assert type(m.decoder.layers[0].self_attn) is MultiHeadAttention
    m = _seq2seq(**SEQ2SEQ_KINDS["performer"])
    enc, dec = m.encoder.layers[0].self_attn, m.decoder.layers[0].self_attn
    assert isinstance(enc, PerformerAttention) and not enc.causal
    assert isinstance(dec, PerformerAttention) and dec.causal
    assert type(m.decoder.layers[0].cross_attn) is MultiHeadAttention


def test_sliding_gpt_matches_an_explicit_window_mask() -> None:
    model = _gpt(**GPT_KINDS["sliding"], backend="math")
    full = _gpt(backend="math")
    full.load_state_dict(model.state_dict())
    x = torch.randint(0, 50, (2, 11))
    _, cache = run_with_cache(model, x)
    w = cache.attentions["transformer.h.0.attn"]
    allowed = sliding_window_mask(11, 11, (3, 0)) & torch.ones(11, 11).tril().bool()
    assert torch.all(w[..., ~allowed] == 0)
    assert torch.allclose(w.sum(-1), torch.ones(()))
    assert not torch.allclose(model(x).logits, full(x).logits)


def test_sliding_encoder_is_symmetric() -> None:
    model = _seq2seq(**SEQ2SEQ_KINDS["sliding"])
    src = torch.randint(3, 30, (1, 9))
    tgt = torch.randint(3, 30, (1, 5))
    with capture(model) as cache:
        model(src, tgt)
    w = cache.attentions["encoder.layers.0.self_attn"][0, 0]
    i, j = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
    assert torch.all(w[(j - i).abs() > 2] == 0) and torch.all(w[(j - i).abs() <= 2] > 0)


# -- Hugging Face interop ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sliding", "performer"])
def test_to_hf_is_refused_for_other_attention(kind: str) -> None:
    with pytest.raises(ValueError, match="attention must be 'full' for GPT-2"):
        _gpt(**GPT_KINDS[kind]).to_hf()


# -- generation: greedy equals the argmax of the full forward, step by step ----------------------


@pytest.mark.parametrize(
    ("kind", "positions"),
    # the Performer layer applies neither rotary nor ALiBi (the config refuses them, tested above)
    [
        (k, p)
        for k in GPT_KINDS
        for p in ("learned", "rope", "alibi")
        if k != "performer" or p == "learned"
    ],
)
def test_gpt_greedy_equals_full_forward(kind: str, positions: str) -> None:
    model = _gpt(positions=positions, **GPT_KINDS[kind])
    prompt = torch.randint(0, 50, (2, 5))
    out = al.generate(model, prompt, max_new_tokens=12)
    assert out.shape == (2, 17)
    with torch.no_grad():
        for i in range(5, 17):
            logits = model(out[:, :i]).logits[:, -1]
            assert torch.equal(logits.argmax(-1), out[:, i]), i


def test_gpt_sliding_uses_a_rolling_cache() -> None:
    model = _gpt(**GPT_KINDS["sliding"])
    cache = model.new_cache(2, 30)
    assert all(layer.window == 3 and layer.capacity == 3 for layer in cache.layers)
    x = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        step = model(x[:, :6], cache=cache).logits
        more = model(x[:, 6:], cache=cache).logits
        full = model(x).logits
    assert cache.length == 9
    torch.testing.assert_close(torch.cat([step, more], 1), full, rtol=1e-4, atol=1e-5)


def test_gpt_performer_decodes_from_running_sums() -> None:
    model = _gpt(**GPT_KINDS["performer"])
    cache = model.new_cache(2, 16)
    # one PerformerState per layer: S (m × d_head), z (m) and c per row and head, float32
    assert all(isinstance(c, PerformerState) for c in cache.layers)
    assert cache.nbytes() == 2 * 2 * 4 * (16 * 8 + 16 + 1) * 4
    x = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        a = model(x[:, :4], cache=cache).logits
        b = model(x[:, 4:], cache=cache).logits
        full = model(x).logits
        ref = RecomputeCache(2, 16)  # the recomputing reference still works
        c = torch.cat([model(x[:, :4], cache=ref).logits, model(x[:, 4:], cache=ref).logits], 1)
    assert cache.length == 9
    torch.testing.assert_close(torch.cat([a, b], 1), full)
    torch.testing.assert_close(c, full)
    kv = _gpt().new_cache(2, 16)
    with pytest.raises(ValueError, match="PerformerState"):
        model(x, cache=kv)


def test_gpt_performer_left_padded_and_beam_generation() -> None:
    model = _gpt(**GPT_KINDS["performer"])
    prompt = torch.randint(1, 50, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    out = al.generate(model, prompt, attention_mask=mask, max_new_tokens=4)
    with torch.no_grad():
        alone = al.generate(model, prompt[1:, 2:], max_new_tokens=4)
    torch.testing.assert_close(out[1, 6:], alone[0, 4:])
    beams = al.generate(model, prompt, max_new_tokens=4, strategy="beam", num_beams=3)
    assert beams.shape[0] == 2


@pytest.mark.parametrize("kind", list(SEQ2SEQ_KINDS))
def test_seq2seq_greedy_equals_full_decode(kind: str) -> None:
    model = _seq2seq(**SEQ2SEQ_KINDS[kind])
    src = torch.randint(3, 30, (2, 7))
    src[1, 5:] = 0
    out = al.generate(model, src, max_new_tokens=8, eos_token_id=[])
    with torch.no_grad():
        memory = model.encode(src)
        for i in range(1, out.shape[1]):
            logits = model.decode(
                out[:, :i], memory, src_mask=al.masks.padding_mask(src, 0)
            ).logits[:, -1]
            assert torch.equal(logits.argmax(-1), out[:, i]), i
    beams = al.generate(model, src, max_new_tokens=5, strategy="beam", num_beams=3)
    assert beams.shape[0] == 2


# -- capture, viewer and head masks work with each ---------------------------------------------


@pytest.mark.parametrize("kind", list(GPT_KINDS))
def test_gpt_capture_viewer_and_head_mask(kind: str) -> None:
    model = _gpt(**GPT_KINDS[kind])
    x = torch.randint(0, 50, (2, 10))
    plain = model(x).logits
    out, cache = run_with_cache(model, x)
    torch.testing.assert_close(out.logits, plain)
    w = cache.attentions["transformer.h.1.attn"]
    assert w.shape == (2, 4, 10, 10)
    assert torch.all(w.triu(1) == 0)  # causal, whatever the kind
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 10))
    html = render_viewer(viewer_data(cache.attentions, tokens=[f"t{i}" for i in range(10)]))
    assert "transformer.h.1.attn" in html
    ones = torch.ones(2, 4)
    torch.testing.assert_close(model(x, head_mask=ones).logits, plain)
    off = ones.clone()
    off[0, 1] = 0
    with capture(model) as masked:
        changed = model(x, head_mask=off).logits
    assert not torch.allclose(changed, plain)
    assert torch.all(masked.attentions["transformer.h.0.attn"][:, 1] == 0)


@pytest.mark.parametrize("kind", list(SEQ2SEQ_KINDS))
def test_seq2seq_capture_viewer_and_head_mask(kind: str) -> None:
    model = _seq2seq(**SEQ2SEQ_KINDS[kind])
    src, tgt = torch.randint(3, 30, (2, 9)), torch.randint(3, 30, (2, 6))
    with capture(model) as cache:
        plain = model(src, tgt).logits
    k_enc = 4 if kind == "linformer" else 9  # Linformer: weights over the k projected keys
    assert cache.attentions["encoder.layers.1.self_attn"].shape == (2, 4, 9, k_enc)
    assert cache.attentions["decoder.layers.1.self_attn"].shape == (2, 4, 6, 6)
    assert cache.attentions["decoder.layers.1.cross_attn"].shape == (2, 4, 6, 9)
    shown = dict(cache.attentions)
    if kind == "linformer":
        # without projected=cache.projected the viewer reads every column as a token, so the
        # T × k weights over projected keys are refused with a clear error; with it they are
        # drawn over their E·K rows (tests/viz/test_linformer_view.py)
        with pytest.raises(ValueError, match="must be"):
            viewer_data(shown, source=list("abcdefghi"), target=list("uvwxyz"), kinds=cache.kinds)
        shown = {n: w for n, w in shown.items() if not n.startswith("encoder")}
    html = render_viewer(
        viewer_data(shown, source=list("abcdefghi"), target=list("uvwxyz"), kinds=cache.kinds)
    )
    assert "decoder.layers.1.cross_attn" in html
    off = torch.ones(2, 4)
    off[1, 2] = 0
    with capture(model) as masked:
        changed = model(src, tgt, head_mask=off).logits
    assert not torch.allclose(changed, plain)
    assert torch.all(masked.attentions["encoder.layers.1.self_attn"][:, 2] == 0)


def test_replace_keeps_other_fields() -> None:
    cfg = dataclasses.replace(GPTConfig(), attention="sliding", window=256)
    assert cfg.attention == al.nn.kinds.SlidingSpec(window=256) and cfg.n_layer == 12
    cfg = dataclasses.replace(cfg, attention=al.nn.kinds.PerformerSpec())
    assert cfg.attention.num_features is None and cfg.n_layer == 12
