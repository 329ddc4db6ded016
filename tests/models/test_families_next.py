"""The decoders added after the first five, each against its ``transformers`` class on a tiny
random config: Qwen2 with windowed and full layers mixed (``use_sliding_window`` with
``max_window_layers``, and an explicit ``layer_types``) and Phi-3 (fused ``qkv_proj`` and
``gate_up_proj``, partial rotary, a sliding window). Float64 within 1e-10: logits, loss,
attention weights (eager ``output_attentions``) and gradients; the round trip through a folder;
cached greedy decoding equal to ``generate``. The models are built once, at module scope.

Hugging Face's RMSNorm rounds its input to float32 and its eager attention takes the softmax in
float32: the float64 reference keeps float64 in both (patched, the norm as in
``test_families.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import attnlab as al
from attnlab.inspect.capture import capture
from attnlab.models.hf import from_hf, save_hf

TINY = {
    "vocab_size": 101,
    "hidden_size": 48,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "intermediate_size": 72,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
}
QWEN2_MIXED = {
    **TINY, "num_hidden_layers": 4, "use_sliding_window": True, "sliding_window": 4,
    "max_window_layers": 2,
}  # fmt: skip
#: name → (config class, model class, config kwargs, the layers attnlab attends fully)
CASES: dict[str, tuple[str, str, dict[str, Any], tuple[int, ...]]] = {
    "qwen2-max-window-layers": ("Qwen2Config", "Qwen2ForCausalLM", QWEN2_MIXED, (0, 1)),
    "qwen2-layer-types": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {**QWEN2_MIXED, "layer_types": ["sliding_attention", "full_attention"] * 2},
        (1, 3),
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            **TINY,
            "num_hidden_layers": 4,
            "head_dim": 8,
            "query_pre_attn_scalar": 12,
            "sliding_window": 4,
            "attn_logit_softcapping": 0.5,
            "final_logit_softcapping": 2.0,
        },
        (1, 3),
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {**TINY, "num_hidden_layers": 2, "partial_rotary_factor": 0.5, "sliding_window": 5},
        (),
    ),
}
_RMSNORMS = (("qwen2", "Qwen2RMSNorm"), ("phi3", "Phi3RMSNorm"), ("gemma2", "Gemma2RMSNorm"))


def _rmsnorm64(self: Any, x: torch.Tensor) -> torch.Tensor:
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
    h = x.to(torch.promote_types(x.dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if type(self).__name__.startswith("Gemma"):  # (1 + g) · x̂
        return (h * (1.0 + self.weight)).to(x.dtype)
    return self.weight * h.to(x.dtype)


def _eager64(modeling: Any) -> Any:
    """The module's ``eager_attention_forward`` with the softmax in the input's dtype."""

    def forward(
        module: Any,
        q: Any,
        k: Any,
        v: Any,
        mask: Any,
        scaling: float,
        softcap: Any = None,
        **_: Any,
    ) -> Any:
        k = modeling.repeat_kv(k, module.num_key_value_groups)
        v = modeling.repeat_kv(v, module.num_key_value_groups)
        scores = q @ k.transpose(2, 3) * scaling
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        weights = (scores if mask is None else scores + mask).softmax(-1)
        return (weights @ v).transpose(1, 2).contiguous(), weights

    return forward


@pytest.fixture(autouse=True)
def float64_reference(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for module, name in _RMSNORMS:
        modeling = getattr(getattr(transformers.models, module), f"modeling_{module}")
        monkeypatch.setattr(getattr(modeling, name), "forward", _rmsnorm64)
        monkeypatch.setattr(modeling, "eager_attention_forward", _eager64(modeling))
    yield


@cache
def models(case: str) -> tuple[Any, al.GPT]:
    """The ``transformers`` model (float64, random weights pushed off their init) and ours."""
    config_cls, model_cls, kwargs, _ = CASES[case]
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(sum(map(ord, case)))
    hf = getattr(transformers, model_cls)._from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.dim() == 1 else 0.05))
    hf = hf.double().eval()
    return hf, from_hf(hf)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def ids(t: int = 12, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 101, (batch, t), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("case", sorted(CASES))
def test_float64_logits_weights_and_gradients_equal_transformers(case: str) -> None:
    hf, gpt = models(case)
    assert gpt.config.full_layers == CASES[case][3]
    x = ids(11)  # longer than the windows (4, 5)
    ref = hf(x, labels=x, output_attentions=True)
    with capture(gpt) as weights:
        out = gpt(x, labels=x)
    assert rel_err(out.logits, ref.logits) < 1e-10
    assert abs(out.loss.item() - ref.loss.item()) < 1e-10
    for name, theirs in zip(weights.names(), ref.attentions, strict=True):
        assert (weights[name] - theirs).abs().max().item() < 1e-12
    hf.zero_grad()
    gpt.zero_grad()
    ref.loss.backward()
    out.loss.backward()
    # every gradient, theirs renamed by the family's own conversion (tied head: the embedding)
    family = al.models.families.family_named(gpt.config.family)
    grads = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None}
    theirs = family.state_from_hf(grads, gpt.config)
    for name, p in gpt.named_parameters():
        assert p.grad is not None, name
        assert rel_err(p.grad, theirs[name]) < 1e-10, name


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_through_a_folder_and_transformers(case: str, tmp_path: Path) -> None:
    hf, gpt = models(case)
    x = ids()
    folder = save_hf(gpt, tmp_path / case)
    again = transformers.AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, dtype=torch.float64, attn_implementation="eager"
    )
    back = from_hf(folder)
    assert back.config == gpt.config
    with torch.no_grad():
        # the same weights; the same logits but for Gemma 2's √d, which transformers rounds
        # to float32 in hf.double() and not when it builds the model in float64
        theirs = dict(hf.named_parameters())
        for name, p in again.named_parameters():
            assert torch.equal(p, theirs[name]), name
        assert rel_err(again.eval()(x).logits, hf(x).logits) <= (1e-7 if case == "gemma2" else 0)
        assert torch.equal(back(x).logits, gpt(x).logits)


@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_greedy_decoding_equals_generate(case: str) -> None:
    hf, gpt = models(case)
    prompt = ids(3, batch=1)  # 3 + 6 tokens: past every window
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(al.generate(gpt, prompt, max_new_tokens=6), ref)


def test_qwen2_layer_types_must_name_every_layer() -> None:
    config = {"model_type": "qwen2", **QWEN2_MIXED, "layer_types": ["full_attention"]}
    with pytest.raises(al.errors.ArgumentError, match="layer_types must be a list of"):
        al.models.hf.config_from_hf(config)


def test_soft_capped_scores_run_on_math_and_are_refused_elsewhere() -> None:
    """Gemma 2's soft-cap goes through the seam: ``auto`` picks ``math``, which applies it; a
    backend that would ignore it refuses the call in one typed line."""
    _, gpt = models("gemma2")
    x = ids(6, batch=1)
    layer = gpt.transformer.h[0].attn
    with torch.no_grad():
        want = gpt(x).logits
        for backend in ("sdpa", "blockwise", "flex"):
            layer.backend = backend
            with pytest.raises(al.errors.ArgumentError, match=f"soft-capped .* got '{backend}'"):
                gpt(x)
        layer.backend = "math"
        assert torch.equal(gpt(x).logits, want)
    layer.backend = "auto"


def test_a_soft_cap_needs_softmax_attention() -> None:
    config = al.GPTConfig(
        vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2, attention="performer",
        attn_softcap=5.0,
    )  # fmt: skip
    with pytest.raises(al.errors.ArgumentError, match="attn_scale and attn_softcap need softmax"):
        al.GPT(config)


def test_inspection_reads_the_soft_capped_weights() -> None:
    """What inspection recomputes from a Gemma 2 call (its statistics, some rows' weights,
    ``scores()``) is the soft-capped softmax the layer computed."""
    from attnlab.inspect.stats import call_stats, call_weights

    _, gpt = models("gemma2")
    calls: list[Any] = []
    layer = gpt.transformer.h[1].attn  # a global layer: every key visible
    handle = layer.hook_call.register_forward_hook(lambda m, a, call: calls.append(call))
    try:
        with torch.no_grad():
            gpt(ids(9, batch=1))
    finally:
        handle.remove()
    call = calls[0]
    with capture(gpt) as weights:
        with torch.no_grad():
            gpt(ids(9, batch=1))
    want = weights[weights.names()[1]]
    assert (call.scores().softmax(-1) - want).abs().max().item() < 1e-12
    rows = torch.arange(9)
    assert (call_weights(call, rows) - want).abs().max().item() < 1e-12
    p = want.clamp_min(1e-300)
    entropy = -(want * p.log()).sum(-1)
    assert (call_stats(call).entropy - entropy).abs().max().item() < 1e-10


@pytest.mark.parametrize("case", ["qwen2-max-window-layers", "gemma2"])
def test_flop_calculator_counts_full_layers_beside_windowed_ones(case: str) -> None:
    from attnlab.inspect.flops import flops, kv_cache_bytes

    _, gpt = models(case)
    cache = gpt.new_cache(1, 20, dtype=torch.float32)
    assert kv_cache_bytes(gpt.config, 20) == cache.nbytes()
    windowed = dataclasses.replace(gpt.config, full_layers=())
    assert flops(gpt.config, 20).forward_total > flops(windowed, 20).forward_total


def test_the_logit_lens_last_row_is_the_soft_capped_logits() -> None:
    from attnlab.inspect.lens import logit_lens

    _, gpt = models("gemma2")
    x = ids(7, batch=1)
    with torch.no_grad():
        want = gpt(x).logits
        assert want.abs().max().item() < 2.0  # final_logit_softcapping = 2
        assert torch.equal(logit_lens(gpt, x).logits[-1], want)


def test_mixing_refuses_decompositions_a_sandwich_norm_breaks() -> None:
    from attnlab.inspect.mixing import mixing

    _, gpt = models("gemma2")
    x = ids(5, batch=1)
    with pytest.raises(al.errors.ArgumentError, match="normalises what attention adds"):
        mixing(gpt, x, "alti")
    with torch.no_grad():
        assert mixing(gpt, x, "rollout").per_layer.shape[0] == 4


def test_qk_spectrum_uses_the_layers_score_scale() -> None:
    from attnlab.inspect.qk_circuits import qk_spectrum

    _, gpt = models("gemma2")
    layer = gpt.transformer.h[0].attn
    own = qk_spectrum(gpt, 0).qk
    assert layer.score_scale == 12**-0.5  # query_pre_attn_scalar = 12, d_head = 8
    try:
        layer.score_scale = 8**-0.5
        plain = qk_spectrum(gpt, 0).qk
    finally:
        layer.score_scale = 12**-0.5
    assert torch.allclose(own, plain * (8 / 12) ** 0.5, rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"head_dim": None}, "head_dim = 256 times num_attention_heads = 6 must be hidden_size"),
        ({"layer_types": ["full_attention"]}, "layer_types must be a list of"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention must be false"),
        ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar must be a finite positive"),
        ({"attn_logit_softcapping": -1.0}, "attn_logit_softcapping must be a finite positive"),
    ],
)
def test_gemma2_configs_attnlab_cannot_hold_are_refused_in_one_line(
    change: dict[str, Any], message: str
) -> None:
    config = {"model_type": "gemma2", **CASES["gemma2"][2], **change}
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(al.errors.ArgumentError, match=message):
        al.models.hf.config_from_hf(config)


def test_gemma2_without_soft_caps_reads_null() -> None:
    config = {"model_type": "gemma2", **CASES["gemma2"][2]}
    config |= {"attn_logit_softcapping": None, "final_logit_softcapping": None}
    got = al.models.hf.config_from_hf(config)
    assert (got.attn_softcap, got.logit_softcap, got.attn_scale) == (None, None, 12**-0.5)


def test_a_soft_capped_config_refuses_a_backend_that_cannot_cap() -> None:
    with pytest.raises(al.errors.ArgumentError, match="backend must be one of auto, math with"):
        al.GPTConfig(vocab_size=11, n_embd=8, n_head=2, attn_softcap=5.0, backend="sdpa")
