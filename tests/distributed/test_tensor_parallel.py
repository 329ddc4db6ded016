"""Tensor parallelism (issue 13): a sharded GPT or Transformer computes what one process does.

The plan and the fused QKV's row order are checked in this process; the sharded models in real
process groups (gloo on the CPU, :mod:`tests.distributed._launch`): one launch of 2 ranks runs every
case — GPT and Transformer, MHA and GQA, learned/rotary/ALiBi positions, padding, head masks,
gradient checkpointing —, one of 4 ranks the GQA GPT, in float64, and each reports the largest
differences from
the same model in one process (every rank builds it from the same seed): logits and loss, the
gradient of every parameter (gathered with ``full_tensor()``, the fused QKV rows put back in
order), the clipped gradient norm, the parameters and AdamW's state after one step, the logits
after it, and a resume: the single-process state dicts loaded into a freshly sharded model and
optimizer, and one more step. float64 DTensor ops work on the CPU, so the bound is 1e-12 (the differences are
~1e-16: the same products summed in another order). The refusals (heads not divisible by the
ranks, other modules, a model sharded twice) are raised inside the group as well.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import attnlab as al
from attnlab.distributed.tensor_parallel import (
    HeadParallel,
    ReplicateParallel,
    full_optimizer_state_dict,
    full_state_dict,
    full_tensors,
    load_full_optimizer_state_dict,
    load_full_state_dict,
    parallelize,
    qkv_row_order,
    tp_plan,
)
from attnlab.distributed.tensor_styles import TensorParallelAttention
from attnlab.models.families import preset
from tests.distributed._launch import launch
from tests.reference import max_err

TOL = 1e-12  # float64
LR, EPS = 1e-2, 1e-8  # AdamW's

# ----------------------------------------------------------------------------------------------
# in this process: the row order and the plans


def test_qkv_row_order_gives_each_rank_its_heads() -> None:
    assert qkv_row_order(2, 2, 1, 2).tolist() == [0, 2, 4, 1, 3, 5]
    for h, h_kv, n in ((4, 4, 2), (4, 2, 2), (8, 4, 4), (8, 2, 2), (6, 3, 3)):
        d_head = 3
        order = qkv_row_order(h, h_kv, d_head, n)
        rows = (h + 2 * h_kv) * d_head
        assert sorted(order.tolist()) == list(range(rows))
        for r, chunk in enumerate(order.chunk(n)):
            q_rows, kv_rows = h * d_head // n, h_kv * d_head // n
            q, k, v = chunk.split([q_rows, kv_rows, kv_rows])
            q_heads = sorted({int(i) // d_head for i in q})
            k_heads = sorted({(int(i) - h * d_head) // d_head for i in k})
            v_heads = sorted({(int(i) - (h + h_kv) * d_head) // d_head for i in v})
            assert q_heads == list(range(r * h // n, (r + 1) * h // n))
            assert k_heads == v_heads == list(range(r * h_kv // n, (r + 1) * h_kv // n))
            # GQA: query head j reads key/value head j // (H / H_kv), held by the same rank
            assert {j // (h // h_kv) for j in q_heads} == set(k_heads)


def test_qkv_row_order_refuses_heads_not_divisible() -> None:
    with pytest.raises(ValueError, match=r"num_heads = 6 is not divisible .* degree 4"):
        qkv_row_order(6, 6, 2, 4)
    with pytest.raises(ValueError, match=r"num_kv_heads = 2 is not divisible .* degree 4"):
        qkv_row_order(4, 2, 2, 4)


def _gpt_config(**kw: Any) -> al.GPTConfig:
    base: dict[str, Any] = {
        "vocab_size": 40,
        "n_positions": 16,
        "n_embd": 16,
        "n_layer": 2,
        "n_head": 4,
        "dropout": 0.0,
    }
    return al.GPTConfig(**(base | kw))


def _transformer_config(**kw: Any) -> al.TransformerConfig:
    base: dict[str, Any] = {
        "src_vocab_size": 30,
        "tgt_vocab_size": 30,
        "d_model": 16,
        "num_heads": 4,
        "num_encoder_layers": 1,
        "num_decoder_layers": 1,
        "d_ff": 32,
        "dropout": 0.0,
        "max_len": 32,
    }
    return al.TransformerConfig(**(base | kw))


def test_gpt_plan() -> None:
    plan = tp_plan(al.GPT(_gpt_config()))
    kinds = {k: type(v) for k, v in plan.items()}
    assert kinds == {
        "transformer.wte": ReplicateParallel,
        "transformer.wpe": ReplicateParallel,
        "transformer.h.*.ln_1": ReplicateParallel,
        "transformer.h.*.attn": HeadParallel,
        "transformer.h.*.attn.c_attn": ColwiseParallel,
        "transformer.h.*.attn.c_proj": RowwiseParallel,
        "transformer.h.*.ln_2": ReplicateParallel,
        "transformer.h.*.mlp.c_fc": ColwiseParallel,
        "transformer.h.*.mlp.c_proj": RowwiseParallel,
        "transformer.ln_f": ReplicateParallel,
        "lm_head": ReplicateParallel,
    }
    # the rows are re-laid out before c_attn is sharded: the order of the plan is applied
    keys = list(plan)
    assert keys.index("transformer.h.*.attn") < keys.index("transformer.h.*.attn.c_attn")
    assert "transformer.wpe" not in tp_plan(al.GPT(_gpt_config(positions="rope")))
    llama = tp_plan(al.GPT(_gpt_config(**preset("llama", n_embd=16, n_head=4))))
    assert type(llama["transformer.h.*.mlp.c_gate"]) is ColwiseParallel
    assert type(llama["lm_head"]) is ReplicateParallel and "transformer.wpe" not in llama


def test_transformer_plan() -> None:
    plan = tp_plan(al.Transformer(_transformer_config()))
    assert type(plan["encoder.layers.*.self_attn"]) is HeadParallel
    assert type(plan["decoder.layers.*.cross_attn"]) is HeadParallel
    assert type(plan["decoder.layers.*.cross_attn.out_proj"]) is RowwiseParallel
    assert type(plan["decoder.layers.*.ff.linear1"]) is ColwiseParallel
    assert type(plan["encoder.layers.*.ff.linear2"]) is RowwiseParallel
    assert type(plan["tgt_embed"]) is ReplicateParallel
    assert "encoder.norm" not in plan  # post-norm: no final LayerNorm
    shared = tp_plan(al.Transformer(_transformer_config(share_embeddings=True, norm_first=True)))
    assert "tgt_embed" not in shared and "encoder.norm" in shared


def test_plan_refuses_other_modules_and_attention() -> None:
    with pytest.raises(
        TypeError, match=r"must be an attnlab\.GPT or attnlab\.Transformer, got Linear"
    ):
        tp_plan(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"config\.attention must be one of .* got 'performer'"):
        tp_plan(al.GPT(_gpt_config(attention="performer")))
    with pytest.raises(TypeError, match="HeadParallel shards MultiHeadAttention, GPTSelfAttention"):
        HeadParallel()._apply(nn.Linear(2, 2), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TensorParallelAttention is not built directly"):
        TensorParallelAttention()
    with pytest.raises(TypeError, match="mesh must be a torch DeviceMesh, got str"):
        parallelize(al.GPT(_gpt_config()), "cpu")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# in process groups: every case against the same model in one process

Errors = dict[str, float]


def _compare(
    errors: Errors,
    case: str,
    make: Callable[[], nn.Module],
    run: Callable[[nn.Module], Any],
    mesh: Any,
) -> nn.Module:
    """Forward, backward, clipping, one AdamW step, the state dicts, and a resumed step: the
    same model in one process against the sharded one."""
    torch.manual_seed(0)
    ref = make().double()
    tp = parallelize(copy.deepcopy(ref), mesh)
    assert all(isinstance(p, DTensor) for p in tp.parameters())

    def err(what: str, a: torch.Tensor, b: torch.Tensor) -> None:
        assert a.shape == b.shape, (case, what, a.shape, b.shape)
        errors[f"{case}: {what}"] = max(errors.get(f"{case}: {what}", 0.0), max_err(a, b))

    out_ref, out_tp = run(ref), run(tp)
    err("logits", out_tp.logits, out_ref.logits)
    err("loss", out_tp.loss, out_ref.loss)
    out_ref.loss.backward()
    out_tp.loss.backward()
    grads = full_tensors(tp, {n: p.grad for n, p in tp.named_parameters()})
    for name, p in ref.named_parameters():
        g = grads[name]
        assert g is not None and p.grad is not None, (case, name)
        err("grad", g, p.grad)
    # gradient clipping works on the DTensor parameters as they are
    norm_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    norm_tp = torch.nn.utils.clip_grad_norm_(tp.parameters(), 0.5)
    assert isinstance(norm_tp, DTensor)
    err("grad norm", norm_tp.full_tensor(), norm_ref)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=LR, eps=EPS, weight_decay=0.1)
    opt_tp = torch.optim.AdamW(tp.parameters(), lr=LR, eps=EPS, weight_decay=0.1)
    opt_ref.step()
    opt_tp.step()
    state = full_state_dict(tp)
    for name, t in ref.state_dict().items():
        err("params after a step", state[name], t)
    # the optimizer's state, whole and in the single-process layout, is the unsharded one's
    saved = full_optimizer_state_dict(tp, opt_tp)
    for index, entry in opt_ref.state_dict()["state"].items():
        for key, value in entry.items():
            err(f"AdamW {key}", saved["state"][index][key], value)
    with torch.no_grad():
        err("logits after a step", run(tp).logits, run(ref).logits)
    # resume: a single-process checkpoint (the tied lm_head stored once, as safetensors does)
    # loads into a freshly sharded model and optimizer, and the next step matches
    torch.manual_seed(1)  # other initial weights, all overwritten
    fresh = parallelize(make().double(), mesh)
    tied = isinstance(ref, al.GPT) and ref.config.tie_embeddings  # an untied head: its own
    weights = {k: v for k, v in ref.state_dict().items() if not (tied and k == "lm_head.weight")}
    load_full_state_dict(fresh, weights if isinstance(ref, al.GPT) else ref.state_dict())
    opt_fresh = torch.optim.AdamW(fresh.parameters(), lr=LR, eps=EPS, weight_decay=0.1)
    load_full_optimizer_state_dict(fresh, opt_fresh, saved)
    with torch.no_grad():
        err("logits after load_full_state_dict", run(fresh).logits, run(ref).logits)
    opt_ref.zero_grad()
    run(ref).loss.backward()
    opt_ref.step()
    run(fresh).loss.backward()
    opt_fresh.step()
    state = full_state_dict(fresh)
    for name, t in ref.state_dict().items():
        err("params after a resumed step", state[name], t)
    return tp


def _refusal(errors: dict[str, str], what: str, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except (TypeError, ValueError) as e:  # named by the builtin type a Python user catches
        errors[what] = f"{'TypeError' if isinstance(e, TypeError) else 'ValueError'}: {e}"
    else:
        errors[what] = "no error"


def _worker(rank: int, world: int, every_case: bool) -> tuple[Errors, dict[str, str]]:
    mesh = init_device_mesh("cpu", (world,))
    errors: Errors = {}
    # 4 heads on 2 ranks; 8 on 4, with key/value heads that split as evenly
    h, d = (4, 16) if world == 2 else (8, 32)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 40, (2, 7), generator=gen)
    keep = torch.ones(2, 7, dtype=torch.long)
    keep[1, :2] = 0  # left padding
    head_mask = torch.ones(2, h, dtype=torch.float64)
    head_mask[0, 1], head_mask[1, -1] = 0.0, 0.5

    def gpt(**kw: Any) -> Callable[[], nn.Module]:
        return lambda: al.GPT(_gpt_config(n_head=h, n_embd=d, **kw))

    def lm(model: nn.Module) -> Any:
        return model(ids, labels=ids)

    def lm_masked(model: nn.Module) -> Any:
        return model(ids, attention_mask=keep, labels=ids, head_mask=head_mask)

    _compare(errors, "GPT GQA rope", gpt(num_kv_heads=h // 2, positions="rope"), lm, mesh)
    # on 4 ranks this case alone (every_case=False): what 4 ranks add to 2 is the fused QKV's rows
    # in 4 chunks (qkv_row_order for degree 4, the heads of ranks 2 and 3) and collectives among
    # 4, which it runs through forward, backward, clipping, the step, the state dicts and a
    # resume; each rank holds 2 query heads and 1 key/value head, as on 2 ranks, so the other
    # models' layers (the Transformer's, whose attentions reorder their QKV rows by the same
    # function) and positions meet nothing on 4 ranks that they do not meet on 2
    if every_case:
        # the families' parts: RMSNorm, SwiGLU's c_gate, untied head; parallel residual, partial
        # rotary (attnlab.models.families.preset, as `attnlab train lm --family`)
        for family in ("llama", "neox"):
            parts = preset(family, n_embd=d, n_head=h)
            kv = {"num_kv_heads": h // 2} if family == "llama" else {}
            _compare(errors, f"GPT {family} padding head_mask", gpt(**parts, **kv), lm_masked, mesh)
        _compare(errors, "GPT MHA ALiBi padding head_mask", gpt(positions="alibi"), lm_masked, mesh)
        _compare(
            errors, "GPT GQA checkpointed", gpt(num_kv_heads=h // 2, gradient_checkpointing=True),
            lm, mesh,
        )  # fmt: skip

    src = torch.randint(3, 30, (2, 6), generator=gen)
    src[0, -2:] = 0  # padding (pad_id 0)
    tgt = torch.randint(3, 30, (2, 5), generator=gen)
    tgt[1, -1] = 0

    def tr(**kw: Any) -> Callable[[], nn.Module]:
        return lambda: al.Transformer(_transformer_config(num_heads=h, d_model=d, **kw))

    def seq2seq(model: nn.Module) -> Any:
        return model(src, tgt, targets=tgt, cross_attn_head_mask=head_mask[0])

    if every_case:
        _compare(errors, "Transformer MHA", tr(), seq2seq, mesh)
        _compare(
            errors, "Transformer GQA pre-norm shared", tr(num_kv_heads=h // 2, norm_first=True,
            share_embeddings=True), seq2seq, mesh,
        )  # fmt: skip

    # the sharded layer's weights are its own heads' weights
    torch.manual_seed(0)
    ref = al.GPT(_gpt_config(n_head=h, n_embd=d, num_kv_heads=h // 2)).double()
    tp = parallelize(copy.deepcopy(ref), mesh)
    x = torch.randn(2, 5, d, dtype=torch.float64, generator=gen)
    out_ref, w_ref = ref.transformer.h[0].attn(x, need_weights=True)
    out_tp, w_tp = tp.transformer.h[0].attn(x, need_weights=True)
    local = h // world
    errors["need_weights: output"] = max_err(out_tp, out_ref)
    errors["need_weights: weights"] = max_err(w_tp, w_ref[:, rank * local : (rank + 1) * local])
    c_attn = tp.transformer.h[0].attn.c_attn.weight
    assert c_attn.placements == (Shard(0),) and tp.lm_head.weight is tp.transformer.wte.weight
    assert tp.transformer.h[0].attn.c_proj.bias.placements == (Replicate(),)

    # dropout: what every rank holds whole stays the same on every rank
    torch.manual_seed(0)
    noisy = parallelize(al.GPT(_gpt_config(n_head=h, n_embd=d, dropout=0.2)).double(), mesh)
    torch.manual_seed(5)
    logits = noisy(ids).logits.contiguous()
    gathered = [torch.empty_like(logits) for _ in range(world)]
    dist.all_gather(gathered, logits)
    errors["dropout: logits across ranks"] = max(max_err(g, logits) for g in gathered)

    refusals: dict[str, str] = {}
    odd = _gpt_config(n_head=h + 1, n_embd=2 * (h + 1))
    _refusal(refusals, "heads", lambda: parallelize(al.GPT(odd), mesh))
    few_kv = _gpt_config(n_head=h, n_embd=d, num_kv_heads=world // 2)
    _refusal(refusals, "kv heads", lambda: parallelize(al.GPT(few_kv), mesh))
    narrow = _transformer_config(num_heads=h, d_model=d, d_ff=2 * world + 1)
    _refusal(refusals, "d_ff", lambda: parallelize(al.Transformer(narrow), mesh))
    _refusal(refusals, "module", lambda: parallelize(nn.Linear(2, 2), mesh))
    _refusal(refusals, "twice", lambda: parallelize(tp, mesh))
    return errors, refusals


def _bound(key: str, errors: Errors) -> float:
    """1e-12, or for what follows the AdamW step the gradient error times the step's largest
    gain: the first step moves a parameter by ``lr · g / (|g| + eps)`` (plus the decay), whose
    derivative in ``g`` is at most ``lr / eps`` = 1e6, reached by the gradients that are
    rounding noise (~1e-17, e.g. of a key bias, which softmax makes exactly zero in exact
    arithmetic: two summation orders give two different noises)."""
    case, _, what = key.partition(": ")
    if what in ("params after a step", "logits after a step", "params after a resumed step"):
        return TOL + LR / EPS * errors[f"{case}: grad"]
    return TOL


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_models_match_one_process(world: int) -> None:
    # every case on 2 ranks; on 4 (twice the processes on a 2-core machine) the GQA GPT (see
    # _worker: what 4 ranks add)
    results = launch(_worker, world, world == 2, timeout=240.0)
    h = 4 if world == 2 else 8
    for rank, (errors, refusals) in enumerate(results):
        assert len(errors) > (40 if world == 2 else 10), errors
        compared = {k.partition(": ")[0] for k in errors}
        assert compared == {"GPT GQA rope", "need_weights", "dropout"} | (
            {
                "GPT llama padding head_mask",
                "GPT neox padding head_mask",
                "GPT MHA ALiBi padding head_mask",
                "GPT GQA checkpointed",
                "Transformer MHA",
                "Transformer GQA pre-norm shared",
            }
            if world == 2
            else set()
        ), compared
        # every comparison of _compare for each model compared
        whats = {k.partition(": ")[2] for k in errors if k.startswith("GPT GQA rope: ")}
        for case in compared - {"need_weights", "dropout"}:
            assert {k.partition(": ")[2] for k in errors if k.startswith(f"{case}: ")} == whats
        bad = {k: v for k, v in errors.items() if not v <= _bound(k, errors)}
        assert not bad, f"rank {rank}: {bad}"
        assert refusals["heads"].startswith(
            f"ValueError: num_heads = {h + 1} is not divisible by the tensor-parallel degree {world}"
        ), refusals
        assert refusals["kv heads"].startswith(
            f"ValueError: num_kv_heads = {world // 2} is not divisible by the tensor-parallel "
            f"degree {world}"
        ), refusals
        assert refusals["d_ff"].startswith(
            f"ValueError: d_ff = {2 * world + 1} is not divisible by the tensor-parallel degree "
            f"{world}"
        ), refusals
        assert refusals["module"].startswith("TypeError: model must be an attnlab.GPT"), refusals
        assert refusals["twice"].startswith("ValueError: model is already distributed"), refusals
