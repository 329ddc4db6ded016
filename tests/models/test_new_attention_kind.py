"""The test of the attention-spec design (issue 20): a new attention kind, defined entirely in
this file, trains through the Python API and through ``attnlab train lm --attention NAME``, is
captured, counted by the FLOP calculator and decoded with its own cache — and no file under
``src/`` names it.

The toy kind is *sharpened* attention, ``softmax(τ · Q Kᵀ / √d_head) V`` with a temperature
``τ`` (``τ > 1`` sharpens every row): its layer scales the queries by ``τ`` and hands them to the
ordinary kernel (:meth:`~attnlab.nn.multihead.MultiHeadAttention.attend_heads`, the one seam),
and its cache is a KV cache that counts the tokens it absorbed (so the test sees that decoding
used the layer's own cache).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import attnlab as al
from attnlab import tasks
from attnlab.cli import main
from attnlab.inspect import capture, flops
from attnlab.nn.kinds import (
    AttentionSite,
    AttentionSpec,
    CliOption,
    attention_kinds,
    register_attention,
    unregister_attention,
)
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.multihead import AttentionCall, MultiHeadAttention
from attnlab.tasks.run import load_run
from attnlab.training.checkpoint import resolve_checkpoint

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"


class CountingCache(KVCache):
    """A KV cache that counts the positions appended to it."""

    appended = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.appended += k.shape[-2]
        return super().append(k, v)


class SharpenedAttention(MultiHeadAttention):
    """``softmax(τ · Q Kᵀ / √d_head) V``: the queries scaled by ``τ``, then the usual kernel."""

    def __init__(self, *args: Any, temperature: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.temperature = temperature

    def attend_heads(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        call: AttentionCall,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return super().attend_heads(q * self.temperature, k, v, call)

    def new_cache(self, batch: int, capacity: int, **kw: Any) -> KVCache:
        weight = self.qkv_parameters()[0]
        return CountingCache(
            batch,
            self.num_kv_heads,
            capacity,
            self.d_head,
            dtype=kw.get("dtype") or weight.dtype,
            device=kw.get("device") or weight.device,
        )


@dataclasses.dataclass(frozen=True)
class SharpenedSpec(AttentionSpec):
    """Sharpened attention with temperature ``τ``."""

    name = "toy_sharpened"
    cli_options: ClassVar[tuple[CliOption, ...]] = (
        CliOption("--toy-sharpen", "temperature", "float", help="the temperature τ"),
    )

    temperature: float = 2.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise al.errors.ArgumentError(f"temperature must be > 0, got {self.temperature}")

    def build(self, site: AttentionSite) -> MultiHeadAttention:
        return site.layer(
            SharpenedAttention,
            backend=site.backend,
            rotary=site.rotary,
            temperature=self.temperature,
        )

    def core_flops(
        self, t_q: int, t_k: int, *, d_head: int, heads: int, kv_heads: int, site: AttentionSite
    ) -> dict[str, int]:
        terms = super().core_flops(
            t_q, t_k, d_head=d_head, heads=heads, kv_heads=kv_heads, site=site
        )
        return {**terms, "sharpen": heads * t_q * d_head}  # τ · Q


@pytest.fixture
def sharpened() -> Iterator[type[SharpenedSpec]]:
    register_attention(SharpenedSpec)
    try:
        yield SharpenedSpec
    finally:
        unregister_attention("toy_sharpened")


TEXT = (
    "to be, or not to be, that is the question:\nwhether 'tis nobler in the mind to suffer\n" * 20
)
TINY = ["--block-size", "16", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
        "--batch-size", "4", "--eval-iters", "2", "--warmup", "2", "--lr-decay-steps", "10"]  # fmt: skip


def _gpt(spec: AttentionSpec) -> al.GPT:
    torch.manual_seed(0)
    cfg = al.GPTConfig(
        vocab_size=30, n_positions=24, n_embd=32, n_layer=2, n_head=4, attention=spec
    )
    return al.GPT(cfg)


def test_no_source_file_names_the_new_kind(sharpened: type[SharpenedSpec]) -> None:
    assert "toy_sharpened" in attention_kinds()
    names = ("toy_sharpened", "toy-sharpen", "Sharpened")
    assert not [p for p in SRC.rglob("*.py") if any(n in p.read_text("utf-8") for n in names)]


def test_it_trains_through_the_python_api(sharpened: type[SharpenedSpec]) -> None:
    model = _gpt(SharpenedSpec(temperature=2.0))
    assert all(type(b.attn).__name__ == "GPTSharpenedAttention" for b in model.transformer.h)
    assert {n for n, _ in model.named_parameters()} == {
        n for n, _ in _gpt(al.nn.kinds.FullSpec()).named_parameters()
    }
    ids = torch.randint(0, 30, (8, 24), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]  # it memorises the batch


def test_it_trains_through_attnlab_tasks_train(
    sharpened: type[SharpenedSpec], tmp_path: Path
) -> None:
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    options = tasks.LMOptions(
        data=str(data), out=str(tmp_path / "run"), steps=6, block_size=16, n_layer=1, n_head=2,
        n_embd=16, batch_size=4, eval_iters=1, warmup=1, lr_decay_steps=10, lr=1e-2,
        attention=SharpenedSpec(temperature=2.0),
    )  # fmt: skip
    run = tasks.train(options, progress=False)
    assert run.step == 6 and run.losses[-1] < run.losses[0]
    assert all(type(b.attn).__name__ == "GPTSharpenedAttention" for b in run.model.transformer.h)
    assert load_run(run.run_dir).config.attention == SharpenedSpec(temperature=2.0)


def test_it_is_the_attention_it_says_and_is_captured(sharpened: type[SharpenedSpec]) -> None:
    model = _gpt(SharpenedSpec(temperature=3.0)).double().eval()
    ids = torch.randint(0, 30, (2, 11))
    with capture(model, hooks=["hook_q", "hook_k"]) as cache:
        model(ids)
    name = "transformer.h.1.attn"
    q, k = cache[f"{name}.hook_q"], cache[f"{name}.hook_k"]  # (B, H, T, d_head)
    scores = 3.0 * q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    causal = torch.ones(11, 11, dtype=torch.bool).tril()
    want = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    torch.testing.assert_close(cache.attentions[name], want)


def test_the_flop_calculator_counts_it(sharpened: type[SharpenedSpec]) -> None:
    cfg = _gpt(SharpenedSpec()).config
    report = flops(cfg, seq_len=16)
    assert report.forward["attention/sharpen"] == 2 * 4 * 16 * 8  # layers · H · T · d_head
    full = flops(dataclasses.replace(cfg, attention=al.nn.kinds.FullSpec()), seq_len=16)
    assert report.forward_total - full.forward_total == 2 * 4 * 16 * 8


def test_it_decodes_with_its_own_cache(sharpened: type[SharpenedSpec]) -> None:
    model = _gpt(SharpenedSpec(temperature=1.5)).double().eval()
    ids = torch.randint(0, 30, (2, 5))
    cache = model.new_cache(2, 12)
    assert all(isinstance(c, CountingCache) for c in cache.layers)
    with torch.no_grad():
        logits = model(ids, cache=cache).logits
        step = model(ids[:, :1], cache=cache).logits
    assert all(c.appended == 6 for c in cache.layers)  # type: ignore[attr-defined]
    full = model(torch.cat([ids, ids[:, :1]], 1)).logits
    torch.testing.assert_close(torch.cat([logits, step], 1), full)
    out = al.generate(model, ids, max_new_tokens=6)
    with torch.no_grad():  # greedy without a cache: the whole prefix each step
        want = ids
        for _ in range(6):
            nxt = model(want).logits[:, -1].argmax(-1, keepdim=True)
            want = torch.cat([want, nxt], 1)
    assert torch.equal(out, want)


def test_it_trains_and_generates_from_the_command_line(
    sharpened: type[SharpenedSpec], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    run = tmp_path / "run"
    argv = ["train", "lm", "--data", str(data), "--out", str(run), *TINY, "--attention",
            "toy_sharpened", "--toy-sharpen", "2.5"]  # fmt: skip
    assert main([*argv, "--steps", "3"]) == 0
    saved = json.loads((resolve_checkpoint(run) / "config.json").read_text())
    assert saved["model"]["attention"] == {"kind": "toy_sharpened", "temperature": 2.5}
    assert saved["args"]["toy_sharpen"] == 2.5
    assert load_run(run).config.attention == SharpenedSpec(temperature=2.5)
    assert main([*argv, "--steps", "4", "--resume"]) == 0
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "to be", "--max-new-tokens", "10",
                 "--strategy", "greedy"]) == 0  # fmt: skip
    assert capsys.readouterr().out.startswith("to be")
    bad = ["train", "lm", "--data", str(data), "--out", str(tmp_path / "bad"), *TINY,
           "--steps", "1", "--attention", "toy_sharpened", "--toy-sharpen", "0"]  # fmt: skip
    assert main(bad) == 2  # the spec's own check, named by its option
    assert "--toy-sharpen must be > 0" in capsys.readouterr().err


def test_registering_refuses_what_is_not_a_kind() -> None:
    with pytest.raises(TypeError, match="kind must be an AttentionSpec subclass"):
        register_attention(int)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already registered"):

        @dataclasses.dataclass(frozen=True)
        class Other(AttentionSpec):
            name = "sliding"

        register_attention(Other)
    with pytest.raises(ValueError, match="reuses window of attention kind 'sliding'"):

        @dataclasses.dataclass(frozen=True)
        class Borrower(AttentionSpec):
            name = "toy_borrower"
            cli_options: ClassVar[tuple[CliOption, ...]] = (CliOption("--window", "w"),)

        register_attention(Borrower)
    with pytest.raises(ValueError, match="built in"):
        unregister_attention("full")
