"""Attribution patching (one forward of each prompt, one backward) against exact activation
patching, float64: exact where the metric is linear in the patched activation, an estimate
elsewhere (its agreement with ``patch_heads`` on a random model is reported, not tuned)."""

from __future__ import annotations

import torch
from torch import nn

from attnlab import GPT, GPTConfig
from attnlab.errors import ArgumentError
from attnlab.inspect import (
    attribution_patch,
    logit_difference,
    patch_heads,
    patch_residual,
    run_with_patches,
)

VOCAB = 61


def tiny(linear: bool = False, **extra: object) -> GPT:
    """Two layers; ``linear``: no MLP and no final norm, so the logits are linear in the last
    layer's head outputs, its values and the stream leaving it."""
    torch.manual_seed(3)
    options = {"mlp": "none" if linear else "standard", **extra}
    cfg = GPTConfig(vocab_size=VOCAB, n_positions=16, n_layer=2, n_embd=32, n_head=4, **options)
    model = GPT(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3) if p.dim() == 1 else p.mul_(3.0)
    if linear:
        model.transformer.ln_f = nn.Identity()  # type: ignore[assignment]
    return model


def prompts(t: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, VOCAB, (t,), generator=g)
    corrupted = clean.clone()
    corrupted[1] = (corrupted[1] + 7) % VOCAB
    return clean, corrupted


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logit_difference(logits, 3, 4)


def test_exact_where_the_metric_is_linear_in_the_activation() -> None:
    model = tiny(linear=True)
    clean, corrupted = prompts()
    est = attribution_patch(model, clean, corrupted, metric)
    exact = patch_heads(model, clean, corrupted, metric, layers=[1])
    assert abs(exact.patched[0] - exact.corrupted).max() > 1e-4  # the heads do matter
    torch.testing.assert_close(est.heads().patched[1], exact.patched[0], rtol=1e-12, atol=1e-12)
    at = patch_heads(model, clean, corrupted, metric, layers=[1], position=-2)
    torch.testing.assert_close(est.heads(-2).patched[1], at.patched[0], rtol=1e-12, atol=1e-12)
    resid = patch_residual(model, clean, corrupted, metric, layers=[0], final=True)
    torch.testing.assert_close(est.residual().patched[-1], resid.patched[-1], rtol=0, atol=1e-12)
    # the values of the last layer: z = A v with A fixed
    hook, v_clean = "transformer.h.1.attn.hook_v", {}
    run_with_patches(model, clean[None], {hook: lambda v: v_clean.setdefault(0, v)})
    logits = run_with_patches(model, corrupted[None], {hook: lambda v: v_clean[0]})
    assert abs(est.corrupted + float(est.v[1].sum()) - float(metric(logits)[0])) < 1e-12
    # the first layer's heads reach the logits through the second's softmax: an estimate
    first = patch_heads(model, clean, corrupted, metric, layers=[0])
    assert (est.heads().patched[0] - first.patched[0]).abs().max() > 1e-6


def test_one_forward_of_each_prompt_and_one_backward() -> None:
    model = tiny()
    clean, corrupted = prompts()
    calls = {"forward": 0, "backward": 0}
    model.register_forward_hook(lambda *_: calls.__setitem__("forward", calls["forward"] + 1))
    model.lm_head.register_full_backward_hook(
        lambda *_: calls.__setitem__("backward", calls["backward"] + 1)
    )
    est = attribution_patch(model, clean, corrupted, metric)
    assert calls == {"forward": 2, "backward": 1}
    assert all(p.grad is None for p in model.parameters())  # weights untouched
    assert est.z.shape == (2, 4, 6) and est.resid.shape == (3, 6)


def test_against_exact_patching_on_a_random_model() -> None:
    """Reported, not tuned: sign agreement and Pearson correlation of the head estimates with
    ``patch_heads`` (grouped-query heads, RMSNorm, rotary: a Llama-like model)."""
    model = tiny(
        norm="rmsnorm", positions="rope", bias=False, mlp="gated", activation="silu",
        family="llama", num_kv_heads=2,
    )  # fmt: skip
    clean, corrupted = prompts()
    est = attribution_patch(model, clean, corrupted, metric).heads()
    exact = patch_heads(model, clean, corrupted, metric)
    a = (est.patched - est.corrupted).flatten()
    b = (exact.patched - exact.corrupted).flatten()
    assert est.corrupted == exact.corrupted and est.clean == exact.clean
    pearson = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    signs = float((a.sign() == b.sign()).double().mean())
    print(f"attribution vs exact on a random model: pearson {pearson:.3f}, signs {signs:.2f}")
    assert pearson > 0  # first-order agreement, whatever the model


def test_bad_input() -> None:
    model = tiny()
    clean, corrupted = prompts()
    est = attribution_patch(model, clean, corrupted, metric)
    for call in (
        lambda: est.heads(site="w"),  # type: ignore[arg-type]
        lambda: est.heads(9),
        lambda: attribution_patch(model, clean, corrupted[:-1], metric),
    ):
        try:
            call()
        except ArgumentError as e:
            assert str(e)
        else:
            raise AssertionError("no error")
    assert est.to_dict()["z"][0][0][0] == float(est.z[0, 0, 0])
