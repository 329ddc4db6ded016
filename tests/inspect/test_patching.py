"""Activation patching and direct logit attribution on tiny random models, float64 where the
claim is exact: GPT-2-like (biases, LayerNorm, learned positions), Llama-like (RMSNorm, rotary,
grouped-query heads, gated MLP) and NeoX-like (parallel residual, partial rotary)."""

from __future__ import annotations

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect import (
    direct_logit_attribution,
    logit_difference,
    patch_heads,
    patch_residual,
    run_with_patches,
)
from attnlab.inspect.capture import attention_modules
from attnlab.viz import attribution_figure, patching_figure

VOCAB = 61
CONFIGS = {
    "gpt2": {"n_embd": 32, "n_head": 4},
    "llama": {
        "n_embd": 48, "n_head": 6, "num_kv_heads": 2, "norm": "rmsnorm", "positions": "rope",
        "bias": False, "mlp": "gated", "activation": "silu", "family": "llama",
    },
    "neox": {
        "n_embd": 48, "n_head": 3, "positions": "rope", "rotary_dim": 4,
        "parallel_residual": True, "family": "neox",
    },
}  # fmt: skip


def tiny(case: str, backend: str = "auto", dtype: torch.dtype = torch.float64) -> GPT:
    torch.manual_seed(sum(map(ord, case)))
    cfg = GPTConfig(vocab_size=VOCAB, n_positions=16, n_layer=3, backend=backend, **CONFIGS[case])
    model = GPT(cfg).to(dtype).eval()
    with torch.no_grad():  # gains and biases away from 1 and 0, weights large enough to matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3) if p.dim() == 1 else p.mul_(5.0)
    return model


def prompts(t: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, VOCAB, (t,), generator=g)
    corrupted = clean.clone()
    corrupted[2] = (corrupted[2] + 5) % VOCAB
    return clean, corrupted


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logit_difference(logits, 3, 4)


def test_logit_difference() -> None:
    logits = torch.arange(2 * 3 * 5, dtype=torch.float64).view(2, 3, 5)
    assert logit_difference(logits, 4, 1).tolist() == [3.0, 3.0]
    assert float(logit_difference(logits[0], 0, 2, position=0)) == -2.0
    with pytest.raises(ArgumentError, match="good = 5 is not a token id"):
        logit_difference(logits, 5, 1)
    with pytest.raises(ArgumentError, match="position = 3 is outside"):
        logit_difference(logits, 0, 1, position=3)


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_patching_a_run_into_itself_changes_nothing(case: str) -> None:
    model = tiny(case)
    _, ids = prompts()
    base = model(ids[None]).logits.detach()
    # one head's own output at every position, and one position's own residual stream
    z = {}
    hook = model.transformer.h[1].attn.hook_z
    handle = hook.register_forward_hook(lambda m, a, out: z.setdefault(0, out))
    model(ids[None])
    handle.remove()

    def same_head(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, 1] = z[0][:, 1]
        return x

    patched = run_with_patches(model, ids[None], {"transformer.h.1.attn.hook_z": same_head})
    assert torch.equal(patched, base)  # one forward of the same shape as base: the same kernels
    # Batched, on any BLAS: a CPU BLAS may compute a product of 3 rows differently from one of 1,
    # and the last rows of one product differently from the first (MKL_CBWR=COMPATIBLE, an AMD
    # EPYC), so the scan compares each row with the same row of a same-shaped unpatched forward
    # (tests/test_blas_paths.py runs this file under other MKL code paths).
    for batch_size in (None, 2, 5):
        for result in (
            patch_heads(model, ids, ids, metric, batch_size=batch_size),
            patch_residual(model, ids, ids, metric, batch_size=batch_size, final=True),
        ):
            assert result.clean == result.corrupted
            assert bool((result.patched == result.corrupted).all())  # bit for bit
            assert bool((result.normalized.isnan()).all())  # 0 / 0: nothing to restore


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_every_head_of_a_layer_equals_the_whole_attention_output(case: str) -> None:
    model = tiny(case)
    clean, corrupted = prompts()
    layer = 1
    seen: dict[str, torch.Tensor] = {}
    block = model.transformer.h[layer]
    h1 = block.attn.hook_z.register_forward_hook(lambda m, a, out: seen.setdefault("z", out))
    h2 = block.hook_attn_out.register_forward_hook(lambda m, a, out: seen.setdefault("a", out))
    model(clean[None])
    h1.remove()
    h2.remove()
    heads = run_with_patches(
        model, corrupted[None], {f"transformer.h.{layer}.attn.hook_z": lambda z: seen["z"]}
    )
    whole = run_with_patches(
        model, corrupted[None], {f"transformer.h.{layer}.hook_attn_out": lambda a: seen["a"]}
    )
    torch.testing.assert_close(heads, whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_the_full_residual_stream_restores_the_clean_run(case: str) -> None:
    model = tiny(case)
    clean, corrupted = prompts()
    last = len(model.transformer.h) - 1
    result = patch_residual(model, clean, corrupted, metric, final=True)
    seen: dict[str, torch.Tensor] = {}
    hook = model.transformer.h[last].hook_resid_pre
    handle = hook.register_forward_hook(lambda m, a, out: seen.setdefault("h", out))
    model(clean[None])
    handle.remove()
    logits = run_with_patches(
        model, corrupted[None], {f"transformer.h.{last}.hook_resid_pre": lambda h: seen["h"]}
    )
    m = float(metric(logits)[0])
    assert (m - result.corrupted) / (result.clean - result.corrupted) == pytest.approx(1, abs=1e-12)
    norm = result.normalized
    # layer 0's input (the embedding) differs only at the changed token: 1 there, 0 elsewhere
    torch.testing.assert_close(norm[0, 2], torch.tensor(1.0, dtype=torch.float64))
    assert bool((norm[0, [0, 1, 3, 4, 5, 6]].abs() < 1e-12).all())
    # after the last layer only the position the metric reads matters
    assert result.rows[-1] == "final"
    assert float(norm[-1, -1]) == pytest.approx(1.0, abs=1e-12)
    assert bool((norm[-1, :-1].abs() < 1e-12).all())
    # positions before the change never matter (causal)
    assert bool((norm[:, :2].abs() < 1e-12).all())


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_dla_parts_sum_to_the_logit(case: str) -> None:
    model = tiny(case)
    clean, _ = prompts()
    logits = model(clean[None]).logits.detach()
    for position in (-1, 3):
        dla = direct_logit_attribution(model, clean, 7, position=position)
        assert dla.logit == pytest.approx(float(logits[0, position, 7]), abs=1e-12)
        assert dla.total == pytest.approx(dla.logit, abs=1e-10)
        assert dla.heads.shape == (3, model.config.n_head)
    diff = direct_logit_attribution(model, clean, 3, against=4)
    assert diff.total == pytest.approx(float(metric(logits)[0]), abs=1e-10)
    if case == "gpt2":  # c_proj and LayerNorm biases are attributed on their own
        assert bool((diff.attn_bias != 0).all()) and diff.final_bias != 0
    if case == "llama":  # no biases, no norm bias
        assert bool((diff.attn_bias == 0).all()) and diff.final_bias == 0


def test_dla_in_float32_within_rounding() -> None:
    model = tiny("llama", dtype=torch.float32)
    clean, _ = prompts()
    dla = direct_logit_attribution(model, clean, 3, against=4)
    assert dla.total == pytest.approx(dla.logit, rel=1e-4, abs=1e-4)


def test_one_position_and_layers() -> None:
    model = tiny("gpt2")
    clean, corrupted = prompts()
    # heads patched before the changed token see identical activations: nothing changes
    early = patch_heads(model, clean, corrupted, metric, position=1)
    assert bool((early.patched == early.corrupted).all()) and early.position == 1
    some = patch_heads(model, clean, corrupted, metric, layers=[2, 0], batch_size=3)
    full = patch_heads(model, clean, corrupted, metric)
    assert some.rows == ("2", "0")
    torch.testing.assert_close(some.patched, full.patched[[2, 0]], rtol=0, atol=1e-12)
    top = full.top(2)
    assert len(top) == 2 and set(top[0]) == {"layer", "head", "patched", "normalized"}
    d = full.to_dict()
    assert d["kind"] == "heads" and len(d["normalized"]) == 3


@pytest.mark.parametrize("case", ["gpt2", "llama"])
def test_results_agree_across_backends(case: str) -> None:
    clean, corrupted = prompts()
    results = {}
    for backend in ("math", "sdpa", "blockwise"):
        model = tiny(case, backend=backend)
        assert all(m.backend == backend for m in attention_modules(model).values())
        results[backend] = (
            patch_heads(model, clean, corrupted, metric),
            direct_logit_attribution(model, clean, 3, against=4),
        )
    ref_heads, ref_dla = results["math"]
    for heads, dla in results.values():
        torch.testing.assert_close(heads.patched, ref_heads.patched, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(dla.heads, ref_dla.heads, rtol=1e-9, atol=1e-9)


def test_errors_name_the_problem() -> None:
    model = tiny("gpt2")
    clean, _ = prompts()
    with pytest.raises(ArgumentError, match=r"same length.*got 7 and 5 tokens"):
        patch_heads(model, clean, clean[:5], metric)
    with pytest.raises(ArgumentError, match=r"one value per row.*\(7,\)"):
        patch_heads(model, clean, clean, lambda lg: lg[0, :, 0])
    with pytest.raises(ArgumentError, match="layer 3 is not one of the model's 3 layers"):
        patch_residual(model, clean, clean, metric, layers=[3])
    with pytest.raises(ArgumentTypeError, match="integer token ids"):
        patch_heads(model, clean.double(), clean, metric)
    with pytest.raises(ArgumentTypeError, match=r"must be an attnlab\.GPT"):
        patch_heads(torch.nn.Linear(2, 2), clean, clean, metric)
    with pytest.raises(ArgumentError, match="not a hook point"):
        run_with_patches(model, clean[None], {"transformer.h.0.nope": lambda x: x})
    with pytest.raises(ArgumentError, match="token = 99 is not a token id"):
        direct_logit_attribution(model, clean, 99)


def test_figures_draw_what_they_show() -> None:
    model = tiny("gpt2")
    clean, corrupted = prompts()
    heads = patching_figure(patch_heads(model, clean, corrupted, metric))
    assert heads.data["normalized"].shape == (3, 4)
    result = patch_residual(model, clean, corrupted, metric)
    plot = patching_figure(result, tokens=[f"t{i}" for i in range(7)])
    assert plot.data["normalized"].shape == (3, 7)
    with pytest.raises(ArgumentError, match="label the 7 positions"):
        patching_figure(result, tokens=["a"])
    bars = attribution_figure(direct_logit_attribution(model, clean, 3, against=4), k=5)
    assert bars.data["dla"].shape == (5,) and bars.data["heads"].shape == (5, 2)
    assert abs(bars.data["dla"][0]) >= abs(bars.data["dla"][-1])
