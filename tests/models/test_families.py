"""Every model family against its ``transformers`` class, from tiny random configs built locally:
Llama (tied and untied, linear and llama3 rope scaling), Mistral (a window shorter than the
prompt), Qwen2 (query/key/value biases), GPT-NeoX (partial rotary, parallel and sequential
residual). Float64 within 1e-10 and fp32 within 1e-4 (relative to the logits' scale), loss and
gradients, cached greedy decoding against ``generate``, and the round trip through a folder.

Hugging Face's ``RMSNorm`` rounds its input to float32 whatever its dtype, and its eager attention
takes the softmax in float32: the float64 reference is its ``sdpa`` attention with an RMSNorm that
keeps float64 (patched below), so that it is a float64 computation throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import attnlab as al
from attnlab.inspect.capture import capture
from attnlab.models.hf import from_hf, save_hf, to_hf

TINY = {
    "vocab_size": 101,
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 6,
    "max_position_embeddings": 64,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
}
LLAMA_LIKE = {**TINY, "intermediate_size": 72, "num_key_value_heads": 2, "rms_norm_eps": 1e-5}

#: name → (transformers config class, model class, config kwargs)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {**LLAMA_LIKE, "rope_theta": 500.0}),
    "llama-tied-mqa": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {**LLAMA_LIKE, "num_key_value_heads": 1, "tie_word_embeddings": True},
    ),
    "llama-biases": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {**LLAMA_LIKE, "attention_bias": True, "mlp_bias": True},
    ),
    "llama-linear": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {**LLAMA_LIKE, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    ),
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            **LLAMA_LIKE,
            "rope_theta": 50.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", {**LLAMA_LIKE, "sliding_window": 5}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {**LLAMA_LIKE, "num_key_value_heads": 3}),
    "neox": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        {**TINY, "num_attention_heads": 3, "intermediate_size": 96, "rotary_pct": 0.25},
    ),
    "neox-sequential": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        {**TINY, "intermediate_size": 96, "rotary_pct": 0.5, "use_parallel_residual": False},
    ),
}


def hf_model(case: str, attn: str = "sdpa") -> Any:
    config_cls, model_cls, kwargs = CASES[case]
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(sum(map(ord, case)))
    model = getattr(transformers, model_cls)._from_config(config, attn_implementation=attn)
    with torch.no_grad():  # norms and biases away from 1 and 0, weights large enough to matter
        for _name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.dim() == 1 else 0.05))
    return model.eval()


@pytest.fixture
def float64_rmsnorm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Hugging Face's RMSNorms, keeping a float64 input in float64."""

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return self.weight * h.to(x.dtype)

    for module, name in (("llama", "LlamaRMSNorm"), ("mistral", "MistralRMSNorm"),
                         ("qwen2", "Qwen2RMSNorm")):  # fmt: skip
        modeling = getattr(getattr(transformers.models, module), f"modeling_{module}")
        monkeypatch.setattr(getattr(modeling, name), "forward", forward)
    yield


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def ids(t: int = 12, batch: int = 2, vocab: int = 101, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", sorted(CASES))
def test_float64_logits_and_gradients_equal_transformers(case: str, float64_rmsnorm: None) -> None:
    hf = hf_model(case).double()
    gpt = from_hf(hf)
    assert gpt.config.family == case.split("-")[0].removesuffix("3")
    x = ids(20)  # longer than Mistral's window (5) and than llama3's original context (16)
    ref = hf(x, labels=x)
    out = gpt(x, labels=x)
    assert out.logits.dtype == torch.float64
    assert rel_err(out.logits, ref.logits) < 1e-10
    assert abs(out.loss.item() - ref.loss.item()) < 1e-10
    ref.loss.backward()
    out.loss.backward()
    ours = dict(gpt.named_parameters())
    got = {n: p.grad for n, p in ours.items()}
    # the embedding's gradient is the same tensor on both sides (tied or not)
    theirs = {n: p.grad for n, p in hf.named_parameters()}
    embed = next(
        g for n, g in theirs.items() if n.endswith(("embed_tokens.weight", "embed_in.weight"))
    )
    assert rel_err(got["transformer.wte.weight"], embed) < 1e-9


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("backend", ["math", "sdpa", "blockwise"])
def test_fp32_logits_on_every_backend(case: str, backend: str) -> None:
    hf = hf_model(case)
    gpt = from_hf(hf)
    for block in gpt.transformer.h:
        block.attn.backend = backend
    x = ids(20)
    with torch.no_grad():
        assert rel_err(gpt(x).logits, hf(x).logits) < 1e-4


@pytest.mark.parametrize("case", ["llama", "mistral-window", "qwen2", "neox"])
def test_attention_weights_equal_eager_output_attentions(case: str) -> None:
    hf = hf_model(case, attn="eager")
    gpt = from_hf(hf)
    x = ids(20, batch=1)
    with torch.no_grad():
        ref = hf(x, output_attentions=True).attentions
        with capture(gpt) as cache:
            gpt(x)
    names = cache.names()
    assert len(names) == len(ref) == 2
    for name, theirs in zip(names, ref):
        assert (cache[name] - theirs).abs().max().item() < 1e-5


@pytest.mark.parametrize("case", ["llama", "mistral-window", "qwen2", "neox"])
def test_cached_greedy_decoding_equals_generate(case: str) -> None:
    hf = hf_model(case)
    gpt = from_hf(hf)
    prompt = ids(7, batch=1)
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=16, do_sample=False, pad_token_id=0)
    got = al.generate(gpt, prompt, max_new_tokens=16)
    assert torch.equal(got, ref)


@pytest.mark.parametrize("case", ["llama", "llama-tied-mqa", "mistral-window", "qwen2", "neox"])
def test_round_trip_through_a_folder_and_transformers(case: str, tmp_path: Path) -> None:
    hf = hf_model(case)
    gpt = from_hf(hf)
    x = ids(20)
    folder = save_hf(gpt, tmp_path / case)
    again = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    back = from_hf(folder)
    rebuilt = to_hf(gpt)
    with torch.no_grad():
        want = hf(x).logits
        assert torch.equal(again.eval()(x).logits, want)
        assert torch.equal(rebuilt.eval()(x).logits, want)
        assert torch.equal(back(x).logits, gpt(x).logits)
    assert back.config == gpt.config


def test_gpt2_checkpoints_write_no_family_fields() -> None:
    from attnlab.models.config import config_to_dict

    data = config_to_dict(al.GPTConfig(vocab_size=10, n_embd=8, n_head=2, n_layer=1))
    assert "norm" not in data and "family" not in data and "rope_scaling" not in data
    llama = from_hf(hf_model("llama3")).config
    again = al.GPTConfig(**{k: v for k, v in config_to_dict(llama).items() if k != "kind"})
    assert again == llama


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_act": "tanh"}, "hidden_act must be one of"),
        ({"head_dim": 4}, "head_dim = 4 times num_attention_heads = 6 must be hidden_size = 48"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_type must be one of"),
        ({"model_type": "t5"}, "model_type must be one of bart, bert, distilbert, electra, gemma2"),
    ],
)
def test_unsupported_options_are_named(change: dict[str, Any], message: str) -> None:
    config = {"model_type": "llama", **LLAMA_LIKE, **change}
    with pytest.raises(ValueError, match=message):
        al.models.hf.config_from_hf(config)
