"""capture / run_with_cache on our GPT, our encoder-decoder and GPT-2 weights from Hugging Face."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab as al
from attnlab import GPT, GPTConfig, MultiHeadAttention, Transformer, TransformerConfig
from attnlab.inspect import attention_modules, capture, run_with_cache


def _gpt(backend: str = "auto", **kw) -> GPT:
    cfg = GPTConfig(
        vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=4, backend=backend, **kw
    )
    return GPT(cfg).eval()


def _no_hooks_left(model: torch.nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("backend", ["auto", "sdpa", "blockwise", "math"])
def test_forward_is_unchanged_by_capture(backend: str) -> None:
    model = _gpt(backend)
    x = torch.randint(0, 50, (2, 12))
    plain = model(x).logits
    out, cache = run_with_cache(model, x)
    assert torch.equal(out.logits, plain)  # bit for bit: the same kernels run
    assert list(cache.attentions) == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert cache.attentions["transformer.h.0.attn"].shape == (2, 4, 12, 12)
    assert _no_hooks_left(model)


def test_weights_are_exact_softmax_rows_of_layer_0() -> None:
    model = _gpt("sdpa")
    x = torch.randint(0, 50, (1, 9))
    _, cache = run_with_cache(model, x)
    block = model.transformer.h[0]
    h = block.ln_1(model.transformer.wte(x) + model.transformer.wpe(torch.arange(9)))
    q, k, _ = block.attn.c_attn(h).split(32, dim=-1)
    q, k = (t.view(1, 9, 4, 8).transpose(1, 2).double() for t in (q, k))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.softmax(scores, dim=-1)
    got = cache["transformer.h.0.attn"]
    assert (got.double() - expected).abs().max() < 1e-6
    assert cache.layers_heads()[:2] == [("transformer.h.0.attn", 0), ("transformer.h.0.attn", 1)]
    assert cache.stack().shape == (2, 1, 4, 9, 9)
    assert torch.equal(
        cache.head("transformer.h.1.attn", 3), cache.attentions["transformer.h.1.attn"][0, 3]
    )


def test_encoder_decoder_self_and_cross_attention() -> None:
    cfg = TransformerConfig(
        src_vocab_size=40, tgt_vocab_size=40, d_model=32, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, d_ff=64, dropout=0.0,
    )  # fmt: skip
    model = Transformer(cfg).eval()
    src = torch.randint(3, 40, (2, 7))
    src[1, 5:] = cfg.pad_id
    tgt = torch.randint(3, 40, (2, 5))
    plain = model(src, tgt).logits
    out, cache = run_with_cache(model, src, tgt)
    assert torch.equal(out.logits, plain)
    assert cache.names("cross") == ["decoder.layers.0.cross_attn", "decoder.layers.1.cross_attn"]
    assert cache.names("self") == [
        "encoder.layers.0.self_attn", "encoder.layers.1.self_attn",
        "decoder.layers.0.self_attn", "decoder.layers.1.self_attn",
    ]  # fmt: skip
    cross = cache["decoder.layers.1.cross_attn"]
    assert cross.shape == (2, 4, 5, 7)
    assert torch.all(cross[1, ..., 5:] == 0)  # padded source keys get no weight
    dec = cache["decoder.layers.0.self_attn"]
    assert torch.all(dec.triu(1) == 0)  # no look-ahead
    assert torch.allclose(cache["encoder.layers.0.self_attn"].sum(-1), torch.ones(2, 4, 7))
    with pytest.raises(ValueError, match="cannot stack weights of different shapes"):
        cache.stack()


def test_gpt2_weights_from_hugging_face_match_its_attentions() -> None:
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.GPT2Config(
        vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, attn_implementation="eager"
    )
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    model = GPT.from_hf(hf).eval()
    x = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        ref = hf(x, output_attentions=True).attentions
        _, cache = run_with_cache(model, x)
    for i, expected in enumerate(ref):
        assert (cache[f"transformer.h.{i}.attn"] - expected).abs().max() < 1e-5


def test_hooks_are_removed_even_on_error() -> None:
    model = _gpt()
    with pytest.raises(ValueError, match="vocab"):
        with capture(model):
            model(torch.tensor([[99]]))  # token id >= vocab_size
    assert _no_hooks_left(model)
    assert not any(m.hook_weights.active for m in attention_modules(model).values())


def test_every_decoding_step_is_kept_in_history() -> None:
    model = _gpt()
    cache_kv = model.new_cache(1, 8)
    with capture(model) as cache:
        model(torch.tensor([[1, 2, 3]]), cache=cache_kv)
        model(torch.tensor([[4]]), cache=cache_kv)
    steps = cache.history["transformer.h.1.attn"]
    assert [tuple(w.shape) for w in steps] == [(1, 4, 3, 3), (1, 4, 1, 4)]
    assert cache.attentions["transformer.h.1.attn"] is steps[-1]


def test_selection_and_other_hook_points() -> None:
    model = _gpt()
    x = torch.randint(0, 50, (1, 6))
    _, cache = run_with_cache(model, x, names=["transformer.h.1"], hooks=["hook_q", "hook_z"])
    assert list(cache.attentions) == ["transformer.h.1.attn"]
    assert cache["transformer.h.1.attn.hook_q"].shape == (1, 4, 6, 8)
    assert set(cache.activations) == {"transformer.h.1.attn.hook_q", "transformer.h.1.attn.hook_z"}
    mha = MultiHeadAttention(16, 2)
    out, single = run_with_cache(mha, torch.randn(1, 3, 16))
    assert list(single.attentions) == [""] and out.shape == (1, 3, 16)


def test_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="has no MultiHeadAttention layer"):
        with capture(torch.nn.Linear(2, 2)):
            pass
    with pytest.raises(ValueError, match="names selects no attention layer"):
        with capture(_gpt(), names=["decoder"]):
            pass
    with pytest.raises(ValueError, match="hooks must name hook points"):
        with capture(_gpt(), hooks=["hook_nothing"]):
            pass
    with pytest.raises(KeyError, match="no attention layer or hook point named 'x'"):
        run_with_cache(_gpt(), torch.tensor([[1]]))[1]["x"]


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_blockwise_stats_without_weights_match_the_weights(positions: str) -> None:
    model = _gpt(positions=positions, num_kv_heads=2)
    x = torch.randint(0, 50, (2, 11))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    _, exact = run_with_cache(model, x, attention_mask=mask)
    with capture(model, weights=False, stats=True) as cache:
        out = model(x, attention_mask=mask)
    assert torch.equal(out.logits, model(x, attention_mask=mask).logits)
    assert not cache.attentions and list(cache.stats) == list(exact.attentions)
    for name, w in exact.attentions.items():
        st = cache.stats[name]
        assert st.entropy.shape == (2, 4, 11)
        assert torch.allclose(st.max_weight, w.amax(-1), atol=1e-5)
        assert torch.allclose(st.entropy, -torch.special.xlogy(w, w).sum(-1), atol=1e-4)
    assert _no_hooks_left(model)
    with pytest.raises(ValueError, match="nothing to capture"):
        with capture(model, weights=False):
            pass


def test_stats_for_cross_attention() -> None:
    cfg = TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=16, num_heads=2, num_encoder_layers=1,
        num_decoder_layers=1, d_ff=32,
    )  # fmt: skip
    model = Transformer(cfg).eval()
    src, tgt = torch.randint(3, 30, (1, 9)), torch.randint(3, 30, (1, 4))
    src[0, 7:] = cfg.pad_id
    with capture(model, stats=True) as cache:
        model(src, tgt)
    w = cache["decoder.layers.0.cross_attn"]
    st = cache.stats["decoder.layers.0.cross_attn"]
    assert torch.allclose(st.max_weight, w.amax(-1), atol=1e-5)
    assert torch.allclose(st.entropy, -torch.special.xlogy(w, w).sum(-1), atol=1e-4)


def test_rotated_queries_and_keys_by_name() -> None:
    """hook_rot_q / hook_rot_k: each hook point has one name (the module path), and the rotated
    queries are what the rotary module makes of hook_q's, at the tokens' positions."""
    from attnlab.nn.hooks import hook_points

    model = _gpt(positions="rope")
    names = hook_points(model)
    assert "transformer.h.1.attn.hook_rot_q" in names and "transformer.h.0.hook_resid_pre" in names
    assert "transformer.h.0.attn.hook_rot_q" not in hook_points(_gpt())  # no rotation, no hook
    x = torch.randint(0, 50, (2, 7))
    _, cache = run_with_cache(model, x, hooks=["hook_q", "hook_rot_q", "hook_rot_k"])
    layer = "transformer.h.1.attn"
    q, rot_q = cache[f"{layer}.hook_q"], cache[f"{layer}.hook_rot_q"]
    assert rot_q.shape == q.shape == (2, 4, 7, 8)
    rotary = model.transformer.h[1].attn.rotary
    torch.testing.assert_close(rot_q, rotary(q, torch.arange(7)), rtol=0, atol=0)
    assert cache[f"{layer}.hook_rot_k"].shape[-2] == 7
    with pytest.raises(ValueError, match="hooks must name hook points"):
        run_with_cache(_gpt(), x, hooks=["hook_rot_q"])


@pytest.mark.parametrize(
    "attention",
    [al.SlidingSpec(window=3), al.BigBirdSpec(block_size=1, num_random_blocks=1),
     al.PerformerSpec(num_features=32), al.LinformerSpec(k=5)],
    ids=["sliding", "bigbird", "performer", "linformer"],
)  # fmt: skip
def test_stats_are_those_of_the_weights_each_kind_computes(attention: al.AttentionSpec) -> None:
    # read from the resolved call: Linformer's are over its projected rows, Performer's of
    # D⁻¹ φ(q) φ(k)ᵀ (they were those of an exact softmax over the tokens)
    torch.manual_seed(0)
    if isinstance(attention, al.LinformerSpec):  # bidirectional only: an encoder
        cfg = TransformerConfig(
            src_vocab_size=30, tgt_vocab_size=30, d_model=16, num_heads=4, num_encoder_layers=1,
            num_decoder_layers=1, d_ff=32, max_len=16, attention=attention,
        )  # fmt: skip
        model: torch.nn.Module = Transformer(cfg).double().eval()
        ids = torch.randint(3, 30, (2, 9))
        ids[1, 7:] = cfg.pad_id

        def run() -> object:
            return model(ids, ids[:, :4])
    else:
        model = al.GPT(
            al.GPTConfig(vocab_size=30, n_positions=16, n_embd=16, n_layer=1, n_head=4,
                         attention=attention)
        ).double().eval()  # fmt: skip
        ids = torch.randint(0, 30, (2, 9))

        def run() -> object:
            return model(ids)

    with torch.no_grad():
        with capture(model) as exact:
            run()
        seen: list[object] = []
        handles = [
            m.hook_call.register_forward_hook(lambda mod, a, call: seen.append(call.weights))
            for m in attention_modules(model).values()
        ]
        with capture(model, weights=False, stats=True) as cache:
            run()
        for h in handles:
            h.remove()
    assert seen and all(w is None for w in seen)  # no T × T matrix was formed
    for name, w in exact.attentions.items():
        st = cache.stats[name]
        torch.testing.assert_close(st.max_weight, w.amax(-1), atol=1e-12, rtol=0)
        torch.testing.assert_close(
            st.entropy, -torch.special.xlogy(w, w).sum(-1), atol=1e-10, rtol=0
        )
        torch.testing.assert_close(st.first_weight, w[..., 0], atol=1e-12, rtol=0)
    assert (list(cache.projected) == ["encoder.layers.0.self_attn"]) == isinstance(
        attention, al.LinformerSpec
    )
