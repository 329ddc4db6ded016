"""Hugging Face GPT-2 interop: attnlab.GPT.from_hf / to_hf against transformers.GPT2LMHeadModel.

Every Hugging Face model here is built locally from a GPT2Config with random weights; nothing is
downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel  # a dev dependency: never skipped

import attnlab as al

TOL = 1e-4  # the bar for fp32 logits


def hf_model(attn_implementation: str = "eager", **overrides: object) -> GPT2LMHeadModel:
    """A random Hugging Face GPT-2; biases and LayerNorms randomised too (HF inits them to 0/1,
    which would hide a bias that is dropped or misplaced)."""
    kwargs = {"vocab_size": 97, "n_positions": 32, "n_embd": 32, "n_layer": 3, "n_head": 4}
    kwargs.update(
        bos_token_id=0, eos_token_id=0, attn_implementation=attn_implementation, **overrides
    )
    model = GPT2LMHeadModel(GPT2Config(**kwargs)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def left_padded(batch: int, t: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (batch, t))
    mask = torch.ones(batch, t, dtype=torch.long)
    mask[0, : t // 2] = 0
    if batch > 2:
        mask[2, :1] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # HF's forward takes them explicitly
    return ids, mask, positions


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_tiny_logits_match_hf(attn_implementation: str) -> None:
    hf = hf_model(attn_implementation)
    gpt = al.GPT.from_hf(hf)
    ids, mask, positions = left_padded(3, 11, 97)
    with torch.no_grad():
        ref = hf(ids).logits
        assert max_err(gpt(ids).logits, ref) < TOL
        assert ref.abs().max() > 0.1  # not a vacuous comparison
        ref_pad = hf(ids, attention_mask=mask, position_ids=positions).logits
        got_pad = gpt(ids, mask).logits
    real = mask.bool()
    assert max_err(got_pad[real], ref_pad[real]) < TOL
    assert torch.isfinite(got_pad).all()


def test_tiny_loss_and_gradients_match_hf() -> None:
    hf = hf_model(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0).train()
    gpt = al.GPT.from_hf(hf)
    assert gpt.training
    ids = torch.randint(0, 97, (2, 9))
    labels = ids.clone()
    labels[1, 4] = -100
    ref = hf(ids, labels=labels).loss
    got = gpt(ids, labels=labels).loss
    assert abs(got.item() - ref.item()) < 1e-5
    ref.backward()
    got.backward()
    hf_params = dict(hf.named_parameters())
    for name, p in gpt.named_parameters():
        g_ref = hf_params[name].grad
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            g_ref = g_ref.t()  # Conv1D stores (in, out)
        torch.testing.assert_close(p.grad, g_ref, atol=1e-5, rtol=1e-4, msg=name)


def test_tiny_cached_decoding_matches_hf() -> None:
    hf = hf_model()
    gpt = al.GPT.from_hf(hf)
    ids, mask, positions = left_padded(2, 8, 97)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, position_ids=positions).logits
        cache = gpt.new_cache(2, 8)
        steps = [gpt(ids[:, :5], mask[:, :5], cache=cache).logits]
        steps += [gpt(ids[:, i : i + 1], mask[:, : i + 1], cache=cache).logits for i in (5, 6, 7)]
    real = mask.bool()
    assert max_err(torch.cat(steps, 1)[real], ref[real]) < TOL


def test_round_trip_to_hf_and_back(tmp_path: Path) -> None:
    gpt = al.GPT(al.GPTConfig(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4)).eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf = gpt.to_hf(attn_implementation="eager")
    assert isinstance(hf, GPT2LMHeadModel) and not hf.training
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # still tied
    ids = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        assert max_err(hf(ids).logits, gpt(ids).logits) < TOL
    hf.save_pretrained(tmp_path)
    back = al.GPT.from_hf(tmp_path)
    assert back.config == gpt.config
    assert back.lm_head.weight is back.transformer.wte.weight  # tied after loading
    for (name, a), (_, b) in zip(gpt.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), name
    back_str = al.GPT.from_hf(str(tmp_path))
    assert torch.equal(
        back_str.transformer.h[1].attn.c_attn.weight, gpt.transformer.h[1].attn.c_attn.weight
    )


def test_config_mapping() -> None:
    hf = hf_model(resid_pdrop=0.2, layer_norm_epsilon=1e-6)
    cfg = al.GPT.from_hf(hf).config
    assert (cfg.vocab_size, cfg.n_positions, cfg.n_embd, cfg.n_layer, cfg.n_head) == (
        97,
        32,
        32,
        3,
        4,
    )
    assert cfg.dropout == 0.2 and cfg.layer_norm_epsilon == 1e-6 and cfg.positions == "learned"


def test_errors() -> None:
    with pytest.raises(ValueError, match="not a directory; attnlab never downloads"):
        al.GPT.from_hf("gpt2")
    with pytest.raises(
        TypeError, match=r"must be a transformers model .* or a directory path, got int"
    ):
        al.GPT.from_hf(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="activation_function must be one of"):
        al.GPT.from_hf(hf_model(activation_function="relu"))
    with pytest.raises(ValueError, match="n_inner must be None or 4 \\* n_embd = 128, got 64"):
        al.GPT.from_hf(hf_model(n_inner=64))
    tiny = {"vocab_size": 97, "n_positions": 32, "n_embd": 32, "n_layer": 1, "n_head": 4}
    with pytest.raises(ValueError, match="positions must be 'learned' for GPT-2, got 'rope'"):
        al.GPT(al.GPTConfig(**tiny, positions="rope")).to_hf()
    with pytest.raises(
        ValueError, match="num_kv_heads must be None or n_head = 4 for GPT-2, got 2"
    ):
        al.GPT(al.GPTConfig(**tiny, num_kv_heads=2)).to_hf()


@pytest.fixture(scope="module")
def gpt2_small_pair() -> tuple[GPT2LMHeadModel, al.GPT]:
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(attn_implementation="sdpa")).eval()  # GPT-2 small, 124M
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.05)
    return hf, al.GPT.from_hf(hf)


def test_gpt2_small_logits_match_hf(gpt2_small_pair: tuple[GPT2LMHeadModel, al.GPT]) -> None:
    hf, gpt = gpt2_small_pair
    assert gpt.num_parameters() == 124_439_808
    ids, mask, positions = left_padded(2, 8, 50257)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, position_ids=positions).logits
        got = gpt(ids, mask).logits
        real = mask.bool()
        assert max_err(got[real], ref[real]) < TOL
        row = 1  # the unpadded row, also without any mask
        assert max_err(gpt(ids[row : row + 1]).logits[0], hf(ids[row : row + 1]).logits[0]) < TOL


def test_from_hf_keeps_the_tie_and_generation_lays_the_matrices_out() -> None:
    """from_hf assigns Hugging Face's tensors and keeps the lm_head / wte tie; generation lays
    the fp32 matrices out (in, out), the layout decoding is measured with."""
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4))
    gpt = al.GPT.from_hf(hf.eval())
    al.generate(gpt, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2)
    linears = [m for m in gpt.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.t().is_contiguous() for m in linears)
    assert gpt.lm_head.weight is gpt.transformer.wte.weight
    ids = torch.randint(0, 97, (2, 9))
    torch.testing.assert_close(gpt(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-4)
