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
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {**TINY, "num_hidden_layers": 2, "partial_rotary_factor": 0.5, "sliding_window": 5},
        (),
    ),
}
_RMSNORMS = (("qwen2", "Qwen2RMSNorm"), ("phi3", "Phi3RMSNorm"))


def _rmsnorm64(self: Any, x: torch.Tensor) -> torch.Tensor:
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
    h = x.to(torch.promote_types(x.dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return self.weight * h.to(x.dtype)


def _eager64(modeling: Any) -> Any:
    """The module's ``eager_attention_forward`` with the softmax in the input's dtype."""

    def forward(module: Any, q: Any, k: Any, v: Any, mask: Any, scaling: float, **_: Any) -> Any:
        k = modeling.repeat_kv(k, module.num_key_value_groups)
        v = modeling.repeat_kv(v, module.num_key_value_groups)
        scores = q @ k.transpose(2, 3) * scaling
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
def models(case: str, attn: str = "sdpa") -> tuple[Any, al.GPT]:
    """The ``transformers`` model (float64, random weights pushed off their init) and ours."""
    config_cls, model_cls, kwargs, _ = CASES[case]
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(sum(map(ord, case)))
    hf = getattr(transformers, model_cls)._from_config(config, attn_implementation=attn)
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
    hf, gpt = models(case, "eager")
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
    theirs = dict(hf.named_parameters())
    ours = dict(gpt.named_parameters())
    assert (
        rel_err(ours["transformer.wte.weight"].grad, theirs["model.embed_tokens.weight"].grad)
        < 1e-10
    )
    assert rel_err(ours["transformer.h.0.attn.c_attn.weight"].grad, _qkv_grad(theirs)) < 1e-10


def _qkv_grad(params: dict[str, torch.Tensor]) -> torch.Tensor:
    if "model.layers.0.self_attn.qkv_proj.weight" in params:
        return params["model.layers.0.self_attn.qkv_proj.weight"].grad
    return torch.cat([params[f"model.layers.0.self_attn.{p}_proj.weight"].grad for p in "qkv"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_through_a_folder_and_transformers(case: str, tmp_path: Path) -> None:
    hf, gpt = models(case)
    x = ids()
    folder = save_hf(gpt, tmp_path / case)
    again = transformers.AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, dtype=torch.float64
    )
    back = from_hf(folder)
    assert back.config == gpt.config
    with torch.no_grad():
        assert torch.equal(again.eval()(x).logits, hf(x).logits)
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
