"""An attention-only GPT (``mlp="none"``; Elhage et al. 2021, Olsson et al. 2022): blocks with
attention and the residual stream only, the model of the induction-head results."""

from __future__ import annotations

import torch

import attnlab as al


def config(**extra: object) -> al.GPTConfig:
    return al.GPTConfig(
        vocab_size=31, n_positions=16, n_embd=16, n_layer=2, n_head=2, positions="rope",
        mlp="none", **extra,
    )  # fmt: skip


def test_blocks_have_no_mlp_and_the_stream_is_embedding_plus_heads() -> None:
    torch.manual_seed(0)
    model = al.GPT(config()).double().eval()
    names = [n for n, _ in model.named_parameters()]
    assert not any(".mlp." in n or ".ln_2." in n for n in names)
    fired: list[str] = []
    for i, block in enumerate(model.transformer.h):
        block.hook_mlp_out.register_forward_hook(lambda *a, i=i: fired.append(f"mlp {i}"))
    x = torch.randint(0, 31, (2, 9))
    outs: dict[int, torch.Tensor] = {}
    for i, block in enumerate(model.transformer.h):
        block.hook_attn_out.register_forward_hook(
            lambda m, args, out, i=i: outs.__setitem__(i, out)
        )
    logits = model(x).logits
    assert fired == []
    # h_L = W_E[x] + Σ_l attn_l   (no MLP writes into the stream)
    stream = model.transformer.wte(x) + outs[0] + outs[1]
    assert torch.allclose(model.lm_head(model.transformer.ln_f(stream)), logits, atol=1e-12)


def test_it_decodes_with_its_cache_as_it_recomputes() -> None:
    torch.manual_seed(1)
    model = al.GPT(config()).eval()
    prompt = torch.randint(0, 31, (1, 5))
    cached = al.generate(model, prompt, max_new_tokens=8)
    ids = prompt
    for _ in range(8):
        ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(cached, ids)
