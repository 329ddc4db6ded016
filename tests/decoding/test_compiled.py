"""generate(compile=True): the model's own decode_step over a static cache, compiled once.

The static path's numerics are checked eagerly for every configuration (float64, 1e-10 against
the growing cache); compiling is slow on the CPU, so a few models are compiled, once per module,
and give the eager tokens and logits.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import attnlab as al
from attnlab.decoding.compiled import CompiledStepper, static_capacity, static_unsupported
from attnlab.decoding.layout import lay_out_for_decoding
from attnlab.decoding.steppers import CausalStepper
from attnlab.nn.kinds import BigBirdSpec, PerformerSpec, SlidingSpec
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.nn.static_cache import StaticKVCache, StaticModelCache, StaticSlots
from tests.decoding._models import tiny_gpt

LLAMA = {
    "positions": "rope",
    "rope_pairing": "halves",
    "num_kv_heads": 2,
    "norm": "rmsnorm",
    "mlp": "gated",
    "activation": "silu",
    "bias": False,
    "tie_embeddings": False,
}
CONFIGS = {
    "gpt2": {},
    "llama": LLAMA,
    "rope-interleaved": {"positions": "rope", "rope_pairing": "interleaved"},
    "alibi": {"positions": "alibi"},
    "mqa": {"positions": "rope", "num_kv_heads": 1},
    "sliding": {"attention": SlidingSpec(window=4)},
    "parallel": {"positions": "rope", "parallel_residual": True},
    "attention-only": {"positions": "rope", "mlp": "none"},
}
#: the ones traced by dynamo (backend "eager": the same graph, run uncompiled; seconds each)
TRACED = {
    "gpt2-parallel": {"parallel_residual": True},
    "llama-sliding": {**LLAMA, "attention": SlidingSpec(window=4)},
    "alibi": {"positions": "alibi"},
}


def _prompt(rows: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 61, (rows, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return ids, mask


def _logits(model: al.GPT, stepper: CausalStepper, feed: torch.Tensor) -> torch.Tensor:
    """The stepper's logits after the prompt and after each fed token: ``(steps + 1, N, V)``."""
    out = [stepper.prefill()]
    out += [stepper.step(tok) for tok in feed.unbind(1)]
    return torch.stack(out)


class _EagerStatic(CompiledStepper):
    """The static path, not compiled: decode_step over the static cache."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.step_fn = lambda model, tokens, cache, mask: model.decode_step(tokens, cache, mask)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("padded", [False, True])
def test_static_path_equals_the_growing_cache_in_float64(name: str, padded: bool) -> None:
    model = tiny_gpt(dtype=torch.float64, **CONFIGS[name])
    ids, mask = _prompt()
    m = mask if padded else None
    feed = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(2))
    want = _logits(model, CausalStepper(model, ids, m, 16), feed)
    got = _logits(model, _EagerStatic(model, ids, m, 16), feed)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.fixture(scope="module")
def models() -> dict[str, al.GPT]:
    torch._dynamo.reset()  # other modules' graphs count towards dynamo's recompile limit
    # laid out for decoding as generate lays them out on its first call: the graph guards the
    # weights' strides, so a CompiledStepper run before generate shares generate's graph rather
    # than compiling one for the other layout (an inductor compile is tens of seconds)
    return {
        name: lay_out_for_decoding(tiny_gpt(dtype=torch.float64, **cfg))
        for name, cfg in TRACED.items()
    }


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo traces the step (fullgraph, recompiles counted) and runs its graph uncompiled."""
    monkeypatch.setattr(CompiledStepper, "backend", "eager")


def _equal_to_eager(model: al.GPT, rows: int) -> None:
    ids, mask = _prompt(rows)
    feed = torch.randint(0, 61, (rows, 9), generator=torch.Generator().manual_seed(2))
    want = _logits(model, CausalStepper(model, ids, mask, 16), feed)
    got = _logits(model, CompiledStepper(model, ids, mask, 16), feed)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    eager = al.generate(model, ids, max_new_tokens=12, attention_mask=mask)
    compiled = al.generate(model, ids, max_new_tokens=12, attention_mask=mask, compile=True)
    # the two paths reduce over other shapes (C slots vs T keys), so their float64 logits agree to
    # 1e-10, not bit for bit; the tokens are equal on any machine because every greedy choice wins
    # by far more than that (its top-2 gap, from one full forward of the decoded sequence)
    full = F.pad(mask, (0, eager.shape[1] - mask.shape[1]), value=1)
    with torch.no_grad():
        logits = model(eager[:, :-1], attention_mask=full[:, :-1]).logits[:, ids.shape[1] - 1 :]
    top2 = logits.topk(2, dim=-1).values
    assert (top2[..., 0] - top2[..., 1]).min() > 1e-6
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("name", sorted(TRACED))
def test_traced_step_equals_eager(models: dict[str, al.GPT], name: str, traced: None) -> None:
    _equal_to_eager(models[name], rows=2)


@pytest.mark.slow
def test_inductor_step_equals_eager(models: dict[str, al.GPT]) -> None:
    """Compiled by inductor (tens of seconds on a CPU: one model), 3 rows: a graph of its own."""
    _equal_to_eager(models["llama-sliding"], rows=3)


def test_beam_search_equals_eager(
    models: dict[str, al.GPT], traced: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = models["llama-sliding"]
    ids, mask = _prompt()
    kw = {"max_new_tokens": 8, "strategy": "beam", "num_beams": 2, "attention_mask": mask}
    # float64 scores within 1e-10 of each other (test above): the token ids are equal on any
    # machine when no two ranked candidates come within far more than that. Beam search ranks its
    # candidates with one topk per step: record the gaps between the finite scores it ranks (and
    # the first one it drops) while the eager path decodes.
    gaps: list[float] = []
    topk = torch.Tensor.topk

    def ranked(self: torch.Tensor, k: int, *args: object, **kwargs: object) -> object:
        if self.dtype == torch.float64 and self.dim() == 2 and k < self.shape[-1]:
            values = topk(self, k + 1, dim=-1).values
            finite = values.isfinite()
            gap = (values[:, :-1] - values[:, 1:])[finite[:, 1:]]
            gaps.extend(gap.tolist())
        return topk(self, k, *args, **kwargs)

    with monkeypatch.context() as patched:  # not undo(): `traced` patched the backend
        patched.setattr(torch.Tensor, "topk", ranked)
        eager = al.generate(model, ids, **kw)
    assert gaps and min(gaps) > 1e-6
    assert torch.equal(al.generate(model, ids, compile=True, **kw), eager)


def test_steps_and_later_calls_do_not_recompile(models: dict[str, al.GPT], traced: None) -> None:
    model = models["gpt2-parallel"]
    before_dict = set(model.__dict__)
    ids = torch.randint(0, 61, (1, 5), generator=torch.Generator().manual_seed(3))
    before = counters["stats"]["unique_graphs"]
    first = al.generate(model, ids, max_new_tokens=10, compile=True)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == before + 1  # one graph for this shape, whatever the number of steps
    again = al.generate(model, ids, max_new_tokens=10, compile=True)
    # another length within the same rounded capacity: the same graph
    longer = al.generate(model, ids, max_new_tokens=14, compile=True)
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(first, again)
    assert torch.equal(longer[:, :15], first)
    assert set(model.__dict__) == before_dict  # nothing kept on the model


def test_a_step_compiles_one_graph_whatever_the_grad_mode(
    models: dict[str, al.GPT], traced: None
) -> None:
    """A stepper run with gradients on (outside generate's no_grad) and fed columns of a token
    matrix, and one under no_grad fed contiguous tokens, share one graph: prefill and steps run
    under no_grad and the tokens are made contiguous, so neither dynamo's grad-mode guard, nor the
    cache's requires_grad, nor the tokens' strides compiles a second one."""
    model = models["gpt2-parallel"]
    ids, feed = torch.randint(0, 61, (2, 3, 4), generator=torch.Generator().manual_seed(4))
    before = counters["stats"]["unique_graphs"]
    runs = []
    for grad, tokens in ((True, feed.unbind(1)), (False, feed.T.contiguous().unbind(0))):
        with torch.set_grad_enabled(grad):
            stepper = CompiledStepper(model, ids, None, 12)
            logits = [stepper.prefill()] + [stepper.step(t) for t in tokens]
        runs.append(torch.stack(logits))
    assert not runs[0].requires_grad
    assert torch.equal(runs[0], runs[1])
    assert counters["stats"]["unique_graphs"] == before + 1


def test_seeded_sampling_equals_eager(models: dict[str, al.GPT], traced: None) -> None:
    model = models["alibi"]
    ids, mask = _prompt()
    kw = {"max_new_tokens": 8, "strategy": "sample", "top_k": 20, "attention_mask": mask}
    # with the scores (drawn from the same tensors as without: tests/decoding/test_scores.py)
    kw["return_scores"] = True
    want = al.generate(model, ids, generator=torch.Generator().manual_seed(5), **kw)
    got = al.generate(model, ids, generator=torch.Generator().manual_seed(5), compile=True, **kw)
    # the same uniform draws over float64 probabilities that agree to ~1e-16: a token could only
    # differ if a draw fell within that of a boundary of the cumulative distribution
    assert torch.equal(got.sequences, want.sequences)
    # the scores come from the same logits: probabilities within 1e-10
    torch.testing.assert_close(got.token_probs, want.token_probs, rtol=0, atol=1e-10)


class _OwnAttention(MultiHeadAttention):
    def attend_heads(self, q, k, v, call):  # type: ignore[no-untyped-def]
        return super().attend_heads(q, k, v, call)


def test_the_spec_decides_and_the_reason_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    ids = torch.randint(0, 61, (1, 5))
    for spec in (PerformerSpec(num_features=16), BigBirdSpec(block_size=4)):
        assert not type(spec).decodes_statically
        model = tiny_gpt(dtype=torch.float32, attention=spec)
        assert spec.name in str(static_unsupported(model))
        with pytest.raises(ValueError, match="cannot decode over a static cache"):
            model.new_cache(1, 16, static=True)
        want = al.generate(model, ids, max_new_tokens=4)
        with caplog.at_level(logging.INFO, logger="attnlab"):
            got = al.generate(model, ids, max_new_tokens=4, compile=True)
        assert torch.equal(got, want)
        assert f"attention {spec.name!r} does not decode over a static cache" in caplog.text
    model = tiny_gpt(dtype=torch.float32)
    assert static_unsupported(model) is None
    model.transformer.h[0].attn.__class__ = _OwnAttention
    assert "overrides attend_heads" in str(static_unsupported(model))
    from tests.decoding._models import tiny_transformer

    assert "not a decoder-only" in str(static_unsupported(tiny_transformer()))


def test_static_cache_mask_is_built_from_the_slot_tensor() -> None:
    slots = StaticSlots(6, torch.device("cpu"))
    layer = StaticKVCache(1, 1, 6, 2, dtype=torch.float32, device=torch.device("cpu"), slots=slots)
    cache = StaticModelCache([layer], slots)
    cache.begin(3)
    k = torch.arange(6.0).view(1, 1, 3, 2)
    view = layer.update(k, k, None, window=(1, 0), is_causal=True)
    assert not view.is_causal and view.keys.shape == (1, 1, 6, 2)
    want = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0]]).bool()
    assert torch.equal(view.mask, want)  # j <= s_i and s_i − j <= 1
    cache.begin(1)  # slot 3, in the same (1,) tensor every step
    assert cache.slots.tolist() == [3] and cache.length == 4
    padding = torch.tensor([False, True, True, True, True, True])[None, None, None]
    view = layer.update(k[:, :, :1], k[:, :, :1], padding, window=None, is_causal=True)
    assert view.mask.flatten().tolist() == [False, True, True, True, False, False]
    with pytest.raises(ValueError, match="no room for 3 more"):
        cache.begin(3)
    with pytest.raises(ValueError, match="causal self-attention only"):
        layer.update(k, k, None, window=None, is_causal=False)
    with pytest.raises(ValueError, match="must cover the static cache's 6 slots"):
        layer.update(k, k, padding[..., :4], window=None, is_causal=True)


def test_capacity_is_rounded_within_the_position_table() -> None:
    model = tiny_gpt(dtype=torch.float32)  # n_positions = 64
    assert static_capacity(model, 17) == 64
    assert static_capacity(model, 64) == 64


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_compile_must_be_a_bool(bad: object) -> None:
    model = tiny_gpt()
    with pytest.raises(TypeError, match="compile must be a bool"):
        al.generate(model, torch.zeros(1, 3, dtype=torch.long), max_new_tokens=2, compile=bad)  # type: ignore[arg-type]


def test_padding_beyond_the_prompt_is_true() -> None:
    model = tiny_gpt(dtype=torch.float64, positions="rope")
    ids, mask = _prompt()
    stepper = _EagerStatic(model, ids, mask, 9)
    assert stepper.mask is not None and stepper.mask.shape == (2, 64)
    assert bool(stepper.mask[:, 7:].all())
    assert torch.equal(F.pad(mask.bool(), (0, 57), value=True), stepper.mask)
