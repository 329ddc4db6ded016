"""The device suite: what must hold on every device present (``pytest -m cuda`` runs its CUDA half).

Each test takes the ``device`` fixture (tests/conftest.py): the CPU always, CUDA when there is
one. On CUDA the attention grid is every backend x mask x GQA x dtype (fp16, bf16, fp32) against
the float64 reference, forward and backward (``flex``, which compiles a kernel per case: every
mask in bf16, fp16 and fp32 under the window); on the CPU, where the other test modules run those
grids already, it is the fp32 slice without ``flex`` (tests/nn/test_flex.py compiles that one).
Then the ``sdpa`` backend under fused kernels only (never PyTorch's math fallback), decoding with
every cache, head masks, capture and statistics, a training step in fp16 and bf16, and (CUDA
only) no host synchronisation on the attention hot path or in a decode step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab as al
from attnlab.inspect import capture, run_with_cache
from attnlab.nn.block_layout import bigbird_layout
from attnlab.nn.kinds import PerformerSpec, SlidingSpec
from attnlab.nn.masks import sliding_window_mask
from attnlab.training import TrainConfig, Trainer
from attnlab.training.losses import token_loss
from attnlab.training.processes import DistInfo
from tests.conftest import CUDA, concrete
from tests.decoding._models import greedy_without_cache, tiny_gpt
from tests.reference import assert_close_rule, attention_ref
from tests.training._tiny_task import VOCAB, TinyBatches, make_optimizer

B, H, T, D = 2, 4, 40, 16
BACKENDS = ["math", "sdpa", "blockwise", "flex"]
MASKS = ["none", "causal", "padding", "bias", "window", "bigbird"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _grid() -> list[Any]:
    cases = []
    for dev in ["cpu"] + (["cuda"] if CUDA else []):
        for backend in BACKENDS:
            for mask in MASKS:
                for h_kv in (H, 2):
                    for dtype in DTYPES:
                        if dev == "cpu" and (dtype != torch.float32 or backend == "flex"):
                            continue
                        # flex compiles a kernel per mask, dtype and shape (seconds each): every
                        # mask in bf16, the other dtypes under the window
                        if backend == "flex" and dtype != torch.bfloat16 and mask != "window":
                            continue
                        marks = [pytest.mark.cuda] if dev == "cuda" else []
                        name = f"{dev}-{backend}-{mask}-kv{h_kv}-{str(dtype)[6:]}"
                        cases.append(
                            pytest.param(dev, backend, mask, h_kv, dtype, marks=marks, id=name)
                        )
    return cases


def _mask(name: str, dev: torch.device) -> tuple[dict[str, Any], torch.Tensor | None, bool]:
    """(kwargs of scaled_dot_product_attention, the reference's dense mask, its is_causal)."""
    if name == "causal":
        return {"is_causal": True}, None, True
    if name == "padding":
        pad = torch.ones(B, 1, 1, T, dtype=torch.bool, device=dev)
        pad[0, ..., 31:] = False
        return {"mask": pad, "is_causal": True}, pad, True
    if name == "bias":
        bias = torch.randn(H, T, T, device=dev)
        return {"mask": bias}, bias, False
    if name == "window":
        return {"is_causal": True, "window": 6}, sliding_window_mask(T, T, (6, 0), dev), False
    if name == "bigbird":
        layout = bigbird_layout(T, block_size=8, num_random_blocks=1)
        return {"block_mask": layout}, layout.to_dense(T, dev), False
    return {}, None, False


@pytest.mark.parametrize(("dev", "backend", "mask", "h_kv", "dtype"), _grid())
def test_backend_mask_gqa_dtype(
    dev: str, backend: str, mask: str, h_kv: int, dtype: torch.dtype
) -> None:
    """Output and q/k/v gradients within 2x the plain same-dtype error of the float64 reference;
    everything stays on the inputs' device."""
    device = concrete(dev)
    kwargs, dense, causal = _mask(mask, device)
    q = torch.randn(B, H, T, D, device=device).to(dtype).requires_grad_()
    k = torch.randn(B, h_kv, T, D, device=device).to(dtype).requires_grad_()
    v = torch.randn(B, h_kv, T, D, device=device).to(dtype).requires_grad_()
    out = al.scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)
    assert out.device == device and out.dtype == dtype
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    base_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref, _ = attention_ref(*ref_in, dense, is_causal=causal)
    base, _ = attention_ref(*base_in, dense, is_causal=causal, upcast=False)
    assert_close_rule(out, ref, base)
    d_out = torch.randn(out.shape, dtype=torch.float64, device=device)
    got = torch.autograd.grad(out, (q, k, v), d_out.to(dtype))
    want = torch.autograd.grad(ref, ref_in, d_out)
    baseline = torch.autograd.grad(base, base_in, d_out.to(dtype))
    for name, g, r, bl in zip(("dq", "dk", "dv"), got, want, baseline, strict=True):
        assert g.device == device
        assert_close_rule(g, r, bl, name)


CACHES: dict[str, dict[str, Any]] = {
    "kv": {},
    "gqa_rope": {"num_kv_heads": 2, "positions": "rope"},
    "alibi": {"positions": "alibi"},
    "rolling_window": {"attention": SlidingSpec(window=6)},
    "performer_state": {"attention": PerformerSpec(num_features=16)},
}


@pytest.mark.parametrize("kind", [*CACHES, "sinks"])
def test_decoding_with_every_cache(device: torch.device, kind: str) -> None:
    """Greedy decoding with the cache gives the tokens of the full forward at every step."""
    model = tiny_gpt(dtype=torch.float32, **CACHES.get(kind, {})).to(device)
    ids = torch.randint(0, 61, (2, 5), device=device)
    if kind == "sinks":  # a sink cache holding everything: the same tokens as the full forward
        got = al.generate(model, ids, max_new_tokens=8, cache_sinks=2, cache_window=20)
    else:
        got = al.generate(model, ids, max_new_tokens=8)
    assert got.device == device
    assert torch.equal(got, greedy_without_cache(model, ids, 8))
    if device.type == "cuda" and kind in ("kv", "gqa_rope"):
        assert torch.equal(al.generate(model, ids, max_new_tokens=8, compile=True), got)


def test_head_mask_capture_and_stats(device: torch.device) -> None:
    """A head mask (on the CPU, applied to a model elsewhere), capture and row statistics."""
    model = tiny_gpt(dtype=torch.float32).to(device)
    ids = torch.randint(0, 61, (2, 9), device=device)
    xi = torch.ones(2, 4)
    xi[0, 1] = 0.0
    masked = model(ids, head_mask=xi).logits
    assert masked.device == device and not torch.equal(masked, model(ids).logits)
    _, cache = run_with_cache(model, ids)
    weights = cache["transformer.h.0.attn"]
    assert weights.device == device
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 9, device=device))
    with capture(model, weights=False, stats=True) as stats_cache:
        model(ids)
    stats = stats_cache.stats["transformer.h.0.attn"]
    assert stats.entropy.device == device
    # the entropy of the captured weights, recomputed in float64
    w = weights.double()
    entropy = -(w * w.clamp_min(1e-300).log()).sum(-1)
    torch.testing.assert_close(stats.entropy.double(), entropy, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_training_step_in_half_precision(
    device: torch.device, precision: str, tmp_path: Path
) -> None:
    """Three optimizer steps of a tiny GPT under autocast: finite, falling loss, fp32 weights."""
    if precision == "fp16" and device.type == "cpu" and not hasattr(torch, "GradScaler"):
        pytest.skip("no CPU GradScaler in this torch")  # pragma: no cover
    model = tiny_gpt(vocab_size=VOCAB, dtype=torch.float32)

    def loss_fn(m: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Any:
        return token_loss(m(batch["x"]).logits, batch["y"])

    trainer = Trainer(
        model,
        make_optimizer=lambda m: make_optimizer(m, factor=0.5),
        batches=TinyBatches(1),
        loss_fn=loss_fn,
        config=TrainConfig(steps=6, **{precision: True}),
        run_dir=tmp_path,
        run_config={"task": "tiny"},
        dist=DistInfo(device=device),
    )
    losses = trainer.fit().losses
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-2:]) < sum(losses[:2])
    assert all(
        p.device.type == device.type and p.dtype == torch.float32 for p in model.parameters()
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_sdpa_backend_reaches_a_fused_kernel(device: torch.device, dtype: torch.dtype) -> None:
    """The ``sdpa`` backend never needs PyTorch's unfused math kernel, forward and backward.

    Only the fused kernels are allowed (``sdpa_kernel``; the math kernel would raise "no
    available kernel"): flash on the CPU; flash, memory-efficient and cuDNN on CUDA. Causal with
    ``T_q == T_k`` and ``T_q < T_k`` (bottom-right, an explicit mask), padding, a window, each
    with grouped-query heads and without.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fused = [SDPBackend.FLASH_ATTENTION]
    if device.type == "cuda":
        fused += [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    q = torch.randn(B, H, 256, 64, device=device, dtype=dtype, requires_grad=True)
    kv = torch.randn(B, 2, 256, 64, device=device, dtype=dtype, requires_grad=True)
    pad = torch.ones(B, 1, 1, 256, dtype=torch.bool, device=device)
    pad[0, ..., 200:] = False
    calls = {
        "causal": (q, {"is_causal": True}),
        "causal, T_q < T_k": (q[:, :, :100], {"is_causal": True}),
        "padding": (q, {"mask": pad, "is_causal": True}),
        "window": (q, {"is_causal": True, "window": 64}),
    }
    for name, (query, kwargs) in calls.items():
        for keys in (kv, kv.repeat_interleave(H // 2, dim=1)):
            with sdpa_kernel(fused):
                out = al.scaled_dot_product_attention(query, keys, keys, backend="sdpa", **kwargs)
                out.float().sum().backward()
            assert q.grad is not None and torch.isfinite(q.grad).all(), name
            q.grad = kv.grad = None
    if device.type == "cpu":  # the guard is real: no fused kernel allowed, the call fails
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]), pytest.raises(RuntimeError):
            al.scaled_dot_product_attention(q, kv, kv, backend="sdpa", is_causal=True)


def test_grouped_heads_go_to_torch_where_flash_takes_them() -> None:
    """``enable_gqa`` only where PyTorch's flash kernel takes it (the CPU; CUDA in half types
    without a mask); elsewhere the key/value heads are repeated, so that the memory-efficient and
    cuDNN kernels can run (on CUDA fp32 GQA had fallen to the math kernel). ``meta`` stands for
    a device other than the CPU."""
    from attnlab.nn.backends.sdpa import uses_enable_gqa

    def case(device: str, dtype: torch.dtype, masked: bool, grad: bool = False) -> bool:
        q = torch.randn(1, 4, 8, 16, device=device, dtype=dtype)
        kv = torch.randn(1, 2, 8, 16, device=device, dtype=dtype, requires_grad=grad)
        mask = torch.ones(8, 8, dtype=torch.bool, device=device) if masked else None
        return uses_enable_gqa(q, kv, kv, mask)

    assert case("cpu", torch.float32, False) and case("cpu", torch.float32, True)
    assert case("cpu", torch.bfloat16, True) and not case("cpu", torch.bfloat16, False, grad=True)
    assert case("meta", torch.bfloat16, False) and case("meta", torch.float16, False)
    assert not case("meta", torch.float32, False) and not case("meta", torch.bfloat16, True)
    assert not case("meta", torch.bfloat16, False, grad=True)


def _no_host_sync(backend: str) -> None:
    """Attention (causal, padding, window) and a decode step run without a host synchronisation."""
    dev = torch.device("cuda")
    q = torch.randn(B, H, 256, D, device=dev, dtype=torch.bfloat16)
    pad = torch.ones(B, 1, 1, 256, dtype=torch.bool, device=dev)
    calls: list[dict[str, Any]] = [
        {"is_causal": True},
        {"is_causal": True, "window": 64},
        {"mask": pad, "is_causal": True},  # flex: the structure's cached tiles, no new BlockMask
    ]
    for kw in calls:
        al.scaled_dot_product_attention(q, q, q, backend=backend, **kw)  # warm up, compile
    steps = []
    for kind in ("kv", "alibi", "rolling_window"):
        model = tiny_gpt(dtype=torch.float32, **CACHES[kind]).to(dev)
        cache = model.new_cache(2, 16)
        model(torch.randint(0, 61, (2, 5), device=dev), cache=cache)
        token = torch.randint(0, 61, (2, 1), device=dev)
        model(token, cache=cache)  # warm up
        steps.append((model, token, cache))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for kw in calls:
            al.scaled_dot_product_attention(q, q, q, backend=backend, **kw)
        for model, token, cache in steps:
            model(token, cache=cache)
    finally:
        torch.cuda.set_sync_debug_mode("default")


if CUDA:  # generated only where there is CUDA (not a skip on the CPU)

    @pytest.mark.cuda
    @pytest.mark.parametrize("backend", ["sdpa", "flex", "math"])
    def test_no_host_sync_on_the_hot_path(backend: str) -> None:
        """Attention (causal, window, padding) and a decode step: no host synchronisation."""
        _no_host_sync(backend)


@pytest.mark.parametrize("kind", list(CACHES))
def test_nothing_is_read_back_off_the_cpu(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the ``meta`` device (shapes only, no values: any read-back raises) attention under
    every mask and a prefill + decoding step run through: off the CPU nothing reads a value back
    to the host, the CPU's stand-in for the CUDA sync check above."""
    autocast = torch.is_autocast_enabled
    monkeypatch.setattr(  # torch has no autocast for "meta"
        torch, "is_autocast_enabled", lambda *a: False if a == ("meta",) else autocast(*a)
    )
    meta = torch.device("meta")
    q = torch.randn(B, H, T, D, device=meta)
    k = torch.randn(B, 2, T, D, device=meta)
    for mask in MASKS:
        kwargs, _, _ = _mask(mask, meta)
        for backend in ("math", "sdpa", "blockwise"):
            out = al.scaled_dot_product_attention(q, k, k, backend=backend, **kwargs)
            assert out.device == meta and out.shape == (B, H, T, D)
    model = tiny_gpt(dtype=torch.float32, **CACHES[kind]).to(meta)
    cache = model.new_cache(2, 16)
    model(torch.zeros(2, 5, dtype=torch.long, device=meta), cache=cache)
    logits = model(torch.zeros(2, 1, dtype=torch.long, device=meta), cache=cache).logits
    assert logits.device == meta and logits.shape == (2, 1, 61)


@pytest.mark.parametrize(
    ("device", "error", "message"),
    [("bogus", ValueError, "device 'bogus': torch knows no such device"),
     ("cuda:99", ValueError, "device 'cuda:99': "),
     (99, ValueError, "device 99: "),
     (1.5, TypeError, "device must be a torch.device, a str such as 'cpu' or 'cuda:1', or a CUDA")],
)  # fmt: skip
def test_a_device_this_machine_lacks_is_refused_by_name(
    device: object, error: type, message: str
) -> None:
    # issue 32: load_pretrained(device='cuda'|'bogus'|5) on a CPU machine raised torch's errors
    from attnlab.tasks.run import load_run

    with pytest.raises(error, match=message):
        al.load_pretrained("smollm2-135m", device=device)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        load_run("no-such-run", device=device)  # type: ignore[arg-type]
