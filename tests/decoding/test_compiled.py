"""generate(compile=True): the static compiled step gives the eager tokens, compiles once."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import attnlab as al
from attnlab.decoding.compiled import static_capacity, static_unsupported
from attnlab.nn.kinds import PerformerSpec, SlidingSpec
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
    "sliding": {"attention": SlidingSpec(window=4)},
    "attention-only": {"positions": "rope", "mlp": "none"},
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request: pytest.FixtureRequest) -> al.GPT:
    return tiny_gpt(dtype=torch.float32, **CONFIGS[request.param])


def _prompt() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 61, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return ids, mask


def test_greedy_tokens_equal_eager(model: al.GPT) -> None:
    ids, mask = _prompt()
    for m in (None, mask):
        want = al.generate(model, ids, max_new_tokens=12, attention_mask=m)
        got = al.generate(model, ids, max_new_tokens=12, attention_mask=m, compile=True)
        assert torch.equal(got, want)


def test_seeded_sampling_equals_eager(model: al.GPT) -> None:
    ids, _ = _prompt()
    kw = {"max_new_tokens": 12, "strategy": "sample", "top_k": 20}
    want = al.generate(model, ids, generator=torch.Generator().manual_seed(5), **kw)
    got = al.generate(model, ids, generator=torch.Generator().manual_seed(5), compile=True, **kw)
    assert torch.equal(got, want)


def test_second_call_does_not_recompile() -> None:
    torch._dynamo.reset()  # the other tests' graphs count towards dynamo's recompile limit
    model = tiny_gpt(dtype=torch.float32, **LLAMA)
    ids = torch.randint(0, 61, (1, 5))
    before = counters["stats"]["unique_graphs"]
    first = al.generate(model, ids, max_new_tokens=10, compile=True)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == before + 1  # the first call compiled the step, once
    again = al.generate(model, ids, max_new_tokens=10, compile=True)
    # another length within the same rounded capacity: the same graph
    longer = al.generate(model, ids, max_new_tokens=14, compile=True)
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(first, again)
    assert torch.equal(longer[:, :15], first)
    assert len(model.__dict__["_attnlab_compiled_steps"]) == 1


def test_unsupported_models_decode_eagerly() -> None:
    model = tiny_gpt(dtype=torch.float32, attention=PerformerSpec(num_features=16))
    assert static_unsupported(model) is not None
    ids = torch.randint(0, 61, (1, 5))
    want = al.generate(model, ids, max_new_tokens=6)
    assert torch.equal(al.generate(model, ids, max_new_tokens=6, compile=True), want)


def test_capacity_is_rounded_within_the_position_table() -> None:
    model = tiny_gpt(dtype=torch.float32)  # n_positions = 64
    assert static_capacity(model, 17) == 64
    assert static_capacity(model, 64) == 64


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_compile_must_be_a_bool(bad: object) -> None:
    model = tiny_gpt()
    with pytest.raises(TypeError, match="compile must be a bool"):
        al.generate(model, torch.zeros(1, 3, dtype=torch.long), max_new_tokens=2, compile=bad)  # type: ignore[arg-type]
