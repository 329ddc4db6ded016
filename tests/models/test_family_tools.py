"""The same tools on every family (GPT-2, Llama, Mistral, Qwen2, GPT-NeoX), on tiny random models
built from :func:`attnlab.models.families.preset` (the parts ``attnlab train lm --family`` trains):
one set of hook names, capture (weights and ``stats=True``), head masks on grouped-query
attention, every backend, cached decoding against the recomputing reference, and the FLOP
calculator's parameter count."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnlab as al
from attnlab.inspect.capture import capture
from attnlab.inspect.flops import flops
from attnlab.models.families import preset
from attnlab.models.gpt_layers import RecomputeCache
from attnlab.nn.hooks import hook_points
from attnlab.nn.kinds import SlidingSpec

F64 = torch.float64
SIZE = {"vocab_size": 53, "n_positions": 32, "n_embd": 48, "n_layer": 2, "n_head": 6}
#: the hook points of every block, whatever the family (rotary ones with positions="rope")
BLOCK_HOOKS = {
    "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_weights", "attn.hook_z",
    "attn.hook_call", "hook_resid_pre", "hook_attn_out", "hook_mlp_out", "hook_resid_post",
}  # fmt: skip
ROTARY_HOOKS = {"attn.hook_rot_q", "attn.hook_rot_k"}


def family_config(name: str, **kw: Any) -> al.GPTConfig:
    """A tiny config of a family: GQA (6 query heads, 2 key/value heads) but for GPT-2 and NeoX;
    Mistral is Llama with a window of 3 (shorter than the prompts below), Qwen2 Llama with
    query/key/value biases."""
    base = "llama" if name in ("mistral", "qwen2") else name
    fields: dict[str, Any] = {**SIZE, **preset(base, n_embd=48, n_head=6)}
    if base == "llama":
        fields["num_kv_heads"] = 2
    if name == "mistral":
        fields.update(attention=SlidingSpec(3), family="mistral")
    if name == "qwen2":
        fields.update(qkv_bias=True, family="qwen2")
    return al.GPTConfig(**{**fields, **kw})


FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "neox")


def _model(name: str, dtype: torch.dtype = F64, **kw: Any) -> al.GPT:
    torch.manual_seed(0)
    model = al.GPT(family_config(name, **kw)).to(dtype).eval()
    with torch.no_grad():  # norms and biases away from 1 and 0, so that every part matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _ids(t: int = 12, b: int = 2) -> torch.Tensor:
    return torch.randint(0, SIZE["vocab_size"], (b, t), generator=torch.Generator().manual_seed(1))


def test_hook_names_are_the_same_on_every_family() -> None:
    names = {}
    for name in FAMILIES:
        points = hook_points(al.GPT(family_config(name)))
        names[name] = {n.split(".", 3)[3] for n in points if n.startswith("transformer.h.0.")}
        assert {n for n in points if ".h." not in n} == set()  # every hook point is a block's
        assert len(points) == SIZE["n_layer"] * len(names[name])
    assert names["gpt2"] == BLOCK_HOOKS  # learned positions: no rotary hook points
    for name in FAMILIES[1:]:
        assert names[name] == BLOCK_HOOKS | ROTARY_HOOKS, name


@pytest.mark.parametrize("name", FAMILIES)
def test_capture_weights_and_stats_on_every_family(name: str) -> None:
    model = _model(name)
    ids = _ids()
    with capture(model, hooks=["hook_z"], stats=True) as cache:
        logits = model(ids).logits
    torch.testing.assert_close(logits, model(ids).logits, rtol=0, atol=0)  # nothing changed
    w = cache.attentions["transformer.h.1.attn"]
    assert w.shape == (2, 6, 12, 12)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 6, 12, dtype=F64))
    assert torch.all(w.triu(1) == 0)  # causal
    if name == "mistral":  # a window of 3: itself and the 3 before it
        assert torch.all(w.tril(-4) == 0)
    assert cache.activations["transformer.h.0.attn.hook_z"].shape == (2, 6, 12, 8)
    assert set(cache.stats) == {"transformer.h.0.attn", "transformer.h.1.attn"}


def test_a_head_mask_removes_one_query_head_of_a_kv_group() -> None:
    """Llama with 6 query heads over 2 key/value heads: removing query head 1 (of the group
    0-2) changes that head's output only, and equals zeroing its slice of ``c_proj``."""
    model = _model("llama")
    ids = _ids()
    mask = torch.ones(6, dtype=F64)
    mask[1] = 0.0
    with torch.no_grad():
        with capture(model, hooks=["hook_z"], weights=False) as full:
            plain = model(ids).logits
        with capture(model, hooks=["hook_z"], weights=False) as cut:
            masked = model(ids, head_mask=mask).logits
        ones = model(ids, head_mask=torch.ones(6, dtype=F64)).logits
        assert torch.equal(ones, plain)  # an all-ones mask is no mask, bit for bit
        z_full = full.activations["transformer.h.0.attn.hook_z"]
        z_cut = cut.activations["transformer.h.0.attn.hook_z"]
        keep = [0, 2, 3, 4, 5]  # the layer's other heads, 0 and 2 share head 1's keys and values
        torch.testing.assert_close(z_cut[:, keep], z_full[:, keep], rtol=0, atol=0)
        assert not torch.allclose(masked, plain)
        d_head = 8
        for block in model.transformer.h:
            block.attn.c_proj.weight[:, d_head : 2 * d_head] = 0.0
        torch.testing.assert_close(model(ids).logits, masked, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", FAMILIES)
def test_every_backend_gives_the_same_logits(name: str) -> None:
    ids = _ids(16)
    logits = {}
    for backend in ("math", "sdpa", "blockwise"):
        with torch.no_grad():
            logits[backend] = _model(name, torch.float32, backend=backend)(ids).logits
    for backend in ("sdpa", "blockwise"):
        torch.testing.assert_close(logits[backend], logits["math"], rtol=1e-4, atol=1e-5)


def _recomputing(model: al.GPT) -> al.GPT:
    def new_cache(batch: int, capacity: int, **kw: Any) -> RecomputeCache:
        return RecomputeCache(batch, capacity, device=kw.get("device"))

    model.new_cache = new_cache  # type: ignore[method-assign]
    return model


@pytest.mark.parametrize("name", ["mistral", "neox"])
def test_cached_decoding_equals_recomputing(name: str) -> None:
    """Mistral's window (3) is shorter than the prompt (7): the rolling KV cache; NeoX's
    partial rotary and parallel residual. Greedy, seeded sampling and beam search, left-padded."""
    model, reference = _model(name), _recomputing(_model(name))
    prompt = _ids(7, 3)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, :2] = 0
    for kw in ({"strategy": "greedy"}, {"strategy": "sample", "top_k": 10},
               {"strategy": "beam", "num_beams": 3}):  # fmt: skip
        got, want = (
            al.generate(
                m,
                prompt,
                attention_mask=mask,
                max_new_tokens=10,
                generator=torch.Generator().manual_seed(3),
                **kw,
            )
            for m in (model, reference)
        )
        assert torch.equal(got, want), kw["strategy"]
    with torch.no_grad():  # the logits too: a prompt, then one token at a time
        ids = _ids(12, 1)
        full = model(ids).logits
        cache = model.new_cache(1, 12)
        steps = [model(ids[:, :7], cache=cache).logits]
        steps += [model(ids[:, i : i + 1], cache=cache).logits for i in range(7, 12)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", FAMILIES)
def test_flop_parameters_and_kv_cache_bytes(name: str) -> None:
    config = family_config(name)
    model = al.GPT(config)
    report = flops(config, seq_len=16, batch=2)
    unique = {id(p): p.numel() for p in model.parameters()}  # a tied head counted once
    assert report.params["total"] == sum(unique.values())
    # keys and values of H_kv heads: 2 · B · H_kv · T · d_head per layer, fp32; a window of w
    # keeps the last w positions (Mistral's rolling cache)
    t = 3 if name == "mistral" else 16
    kv = 2 * 2 * config.kv_heads * t * config.d_head * config.n_layer * 4
    assert report.memory["kv_cache"] == kv
