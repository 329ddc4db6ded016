"""Megatron-style tensor parallelism (Shoeybi et al. 2019, §3) with PyTorch's DTensor.

Every rank of a 1-D device mesh of ``N`` ranks holds ``1/N`` of each attention layer's heads and
of each feed-forward block's hidden units, and the whole of everything else. Every rank is fed
the same batch; one all-reduce after each attention and each feed-forward block in the forward
pass, and one before each in the backward pass, keep the residual stream identical on every
rank. The result is that of the same model in one process: the same logits, and after
:func:`full_tensors` the same gradients (float64: equal to ~1e-15).

**The sharding rule.** A feed-forward block ``FFN(x) = act(x W_1 + b_1) W_2 + b_2`` (attnlab
stores ``nn.Linear`` weights ``(out, in)``, so ``x W_1`` is ``F.linear(x, linear1.weight)``)::

    linear1 / c_fc   weight (d_ff, d_model)  Shard(0)  bias Shard(0)     column parallel
    linear2 / c_proj weight (d_model, d_ff)  Shard(1)  bias Replicate    row parallel

Rank ``r`` computes ``act(x W_1[:, cols_r] + b_1[cols_r])`` from the whole ``x`` (the activation
is elementwise, so the columns need nothing from each other), multiplies it by the matching rows
``W_2[rows_r, :]`` and gets a *partial sum* of ``FFN(x)``: one all-reduce (DTensor's
``Partial → Replicate``, in ``RowwiseParallel``'s output) adds the ranks' parts, and ``b_2`` is
added once. In the backward pass the gradient with respect to ``x`` is partial in the same way
and is all-reduced where the column-parallel layer takes its input (``ColwiseParallel`` marks it
``Replicate``: Megatron's ``f``; the forward all-reduce is its ``g``).

Attention is the same with heads as the hidden units: ``Q``, ``K``, ``V`` are column parallel
(each rank projects its heads' queries, keys and values), every head attends on its own, and the
output projection ``W^O`` (``out_proj`` / ``c_proj``, ``(d_model, d_model)``) is row parallel,
``Shard(1)``: rank ``r`` holds the columns that read its heads' outputs.

**The fused QKV needs its rows re-laid out.** The projections are one matrix (``in_proj_weight``
of :class:`~attnlab.nn.multihead.MultiHeadAttention`, ``c_attn.weight`` of GPT), its rows
``[W^Q; W^K; W^V]`` = ``[H · d_head; H_kv · d_head; H_kv · d_head]``. ``Shard(0)`` of that matrix
would give rank 0 of 2 the first half of the rows: all of ``W^Q`` and none of ``W^K``, ``W^V``.
Rank ``r`` must get the rows of *its* heads in each of the three (query heads
``[r · H/N, (r+1) · H/N)``, key/value heads ``[r · H_kv/N, (r+1) · H_kv/N)``), three
non-contiguous blocks, which no DTensor placement over the matrix as it is describes (the three
blocks have different sizes under GQA). So the rows are permuted once, before sharding, to
``[W^Q_0; W^K_0; W^V_0; W^Q_1; W^K_1; W^V_1; …]`` (:func:`qkv_row_order`); ``Shard(0)`` of that
matrix gives rank ``r`` exactly ``[W^Q_r; W^K_r; W^V_r]``, the fused weight of a layer with
``H/N`` query and ``H_kv/N`` key/value heads. The bias is permuted alike. A gathered
(``full_tensor()``) fused weight is therefore in the permuted order: :func:`full_tensors`,
:func:`full_state_dict`, :func:`load_full_state_dict` and their optimizer counterparts undo and
redo the permutation, so that checkpoints keep the single-process layout (which the permutation,
a function of ``N``, must not leak into: a run saved on 2 ranks resumes on 4, or in one process).

**Grouped-query attention.** Query head ``h`` reads key/value head ``h // (H / H_kv)``. With the
contiguous split above, rank ``r``'s query heads ``r · H/N + i`` read key/value heads
``r · H_kv/N + i // (H / H_kv)``: the rank's own. ``H`` and ``H_kv`` must both be divisible by
``N`` (a :class:`ValueError` says which is not).

**Local head counts.** After sharding, a layer computes with ``num_heads = H/N`` and
``num_kv_heads = H_kv/N`` (its attributes are set to those; ``d_model`` stays the model width,
which its input and output keep), so ``view(B, T, H/N, d_head)`` splits the local projection.
The layer's class is switched to a subclass (as FSDP2's ``fully_shard`` does),
:class:`~attnlab.distributed.tensor_styles.TensorParallelAttention`, that splits the local
projection by ``H/N · d_head`` instead of ``d_model`` and, from a per-head mask or head mask
given for all ``H`` heads, takes the rank's heads. The styles live in
:mod:`attnlab.distributed.tensor_styles`.

**Everything else is replicated**: embeddings, LayerNorms, the LM head (tied weights stay tied),
as ``Replicate`` DTensors (:class:`ReplicateParallel`), so that every parameter is a DTensor and
``torch.nn.utils.clip_grad_norm_``, optimizers and ``torch.distributed.checkpoint`` see one
kind of parameter. Their gradients are computed whole, identically, on every rank.

Limits: attention ``"full"``, ``"sliding"`` and ``"bigbird"`` only (Performer and Linformer
layers have per-layer random or projection parameters that this plan does not split); the
returned or hooked attention weights and per-head tensors are the rank's heads; decoding with a
KV cache needs caches of ``H_kv/N`` heads per rank (``model.new_cache`` makes ``H_kv``); with
dropout, the masks inside the sharded regions (attention weights, the feed-forward's inner
activations) are drawn from the same generator state on every rank, so they repeat across the
ranks' shards (the replicated regions stay identical across ranks, as every rank draws the
same number of random numbers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from attnlab.distributed.tensor_styles import (
    HeadParallel,
    ReplicateParallel,
    TensorParallelAttention,
    check_heads,
    qkv_row_order,
)
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.gpt import GPT
from attnlab.models.transformer import Transformer
from attnlab.nn.kinds import AttentionSpec, attention_kinds, spec_class
from attnlab.training.processes import local_tensor

if TYPE_CHECKING:
    from torch.optim import Optimizer

__all__ = [
    "HeadParallel",
    "ReplicateParallel",
    "full_optimizer_state_dict",
    "full_state_dict",
    "full_tensors",
    "load_full_optimizer_state_dict",
    "load_full_state_dict",
    "parallelize",
    "qkv_row_order",
    "shardable_attentions",
    "tp_plan",
]

ModelT = TypeVar("ModelT", bound=nn.Module)


def shardable_attentions() -> tuple[str, ...]:
    """The attention kinds whose layers this module shards: per-head, parameter-free softmax
    patterns (:attr:`~attnlab.nn.kinds.AttentionSpec.shards_by_heads`; full, sliding, BigBird).

    Returns:
        Their names.
    """
    return tuple(k for k in attention_kinds() if spec_class(k).shards_by_heads)


# ----------------------------------------------------------------------------------------------
# the plans


def tp_plan(model: nn.Module) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of a :class:`~attnlab.GPT` or :class:`~attnlab.Transformer`, as
    ``torch.distributed.tensor.parallel.parallelize_module`` takes it (applied in this order).

    GPT (``*`` = every block)::

        transformer.wte, transformer.wpe          ReplicateParallel   (lm_head stays tied to wte)
        transformer.h.*.ln_1, .ln_2, ln_f        ReplicateParallel
        transformer.h.*.attn                      HeadParallel        (c_attn rows re-laid out)
        transformer.h.*.attn.c_attn               ColwiseParallel     weight Shard(0), bias Shard(0)
        transformer.h.*.attn.c_proj               RowwiseParallel     weight Shard(1), bias Replicate
        transformer.h.*.mlp.c_fc, .c_gate         ColwiseParallel     (c_gate: a gated MLP)
        transformer.h.*.mlp.c_proj                RowwiseParallel
        lm_head                                   ReplicateParallel   (tied or its own)

    Transformer (encoder self-attention; decoder self- and cross-attention)::

        src_embed, tgt_embed, lm_head, norms      ReplicateParallel
        {encoder,decoder}.layers.*.self_attn      HeadParallel        (in_proj_weight Shard(0),
        decoder.layers.*.cross_attn               HeadParallel         rows re-laid out)
        ….self_attn.out_proj, ….cross_attn.out_proj   RowwiseParallel
        ….ff.linear1                              ColwiseParallel
        ….ff.linear2                              RowwiseParallel

    Args:
        model: a :class:`~attnlab.GPT` or :class:`~attnlab.Transformer` (not yet distributed).

    Returns:
        ``{module path: style}``; paths may hold ``*`` (every child), as ``parallelize_module``
        reads them.

    Raises:
        TypeError: another kind of module.
        ValueError: an attention pattern other than ``"full"``, ``"sliding"``, ``"bigbird"``.
    """
    if isinstance(model, GPT):
        return _gpt_plan(model)
    if isinstance(model, Transformer):
        return _transformer_plan(model)
    raise ArgumentTypeError(
        f"model must be an attnlab.GPT or attnlab.Transformer, got {type(model).__name__}"
    )


def _check_attention(spec: AttentionSpec) -> None:
    if not spec.shards_by_heads:
        kinds = ", ".join(repr(a) for a in shardable_attentions())
        raise ArgumentError(
            f"tensor parallelism shards softmax attention by heads: config.attention must be one "
            f"of {kinds}, got {spec.name!r}"
        )


def _gpt_plan(model: GPT) -> dict[str, ParallelStyle]:
    _check_attention(model.config.attention)
    plan: dict[str, ParallelStyle] = {"transformer.wte": ReplicateParallel()}
    if model.transformer.wpe is not None:
        plan["transformer.wpe"] = ReplicateParallel()
    block = "transformer.h.*"
    plan |= {
        f"{block}.ln_1": ReplicateParallel(),
        f"{block}.attn": HeadParallel(),  # before c_attn: its rows are re-laid out first
        f"{block}.attn.c_attn": ColwiseParallel(),
        f"{block}.attn.c_proj": RowwiseParallel(),
        "transformer.ln_f": ReplicateParallel(),
        "lm_head": ReplicateParallel(),
    }
    if model.config.mlp != "none":  # an attention-only model has no ln_2 and no MLP
        plan |= {
            f"{block}.ln_2": ReplicateParallel(),
            f"{block}.mlp.c_fc": ColwiseParallel(),
            f"{block}.mlp.c_proj": RowwiseParallel(),
        }
    if model.config.mlp == "gated":  # act(x W_gate) ⊙ x W_fc: both split by units
        plan[f"{block}.mlp.c_gate"] = ColwiseParallel()
    return plan


def _transformer_plan(model: Transformer) -> dict[str, ParallelStyle]:
    _check_attention(model.config.attention)
    plan: dict[str, ParallelStyle] = {"src_embed": ReplicateParallel()}
    if model.tgt_embed is not model.src_embed:
        plan["tgt_embed"] = ReplicateParallel()
    stacks = (
        ("encoder", ("self_attn",), ("norm1", "norm2")),
        ("decoder", ("self_attn", "cross_attn"), ("norm1", "norm2", "norm3")),
    )
    for stack, attentions, norms in stacks:
        layer = f"{stack}.layers.*"
        for attn in attentions:
            plan[f"{layer}.{attn}"] = HeadParallel()
            plan[f"{layer}.{attn}.out_proj"] = RowwiseParallel()
        plan[f"{layer}.ff.linear1"] = ColwiseParallel()
        plan[f"{layer}.ff.linear2"] = RowwiseParallel()
        for norm in norms:
            plan[f"{layer}.{norm}"] = ReplicateParallel()
        if any(True for _ in model.get_submodule(f"{stack}.norm").parameters()):
            plan[f"{stack}.norm"] = ReplicateParallel()  # pre-norm's final LayerNorm
    plan["lm_head"] = ReplicateParallel()
    return plan


# ----------------------------------------------------------------------------------------------
# parallelize


def parallelize(model: ModelT, mesh: DeviceMesh) -> ModelT:
    """Shard a model's attention heads and feed-forward units over a 1-D device mesh (in place).

    Applies :func:`tp_plan` with ``parallelize_module``: attention column parallel by heads
    (the fused QKV's rows re-laid out per rank, see the module's docstring), output projections
    row parallel, feed-forward first linear column parallel and second row parallel, the rest
    replicated. Every parameter becomes a DTensor, with rank 0's values (whatever the other
    ranks held). Feed every rank the same batch; the logits and the loss come out whole on every
    rank, and ``p.grad.full_tensor()`` is the single-process gradient (the fused QKV's in the
    permuted row order: use :func:`full_tensors`).

    Call it after moving the model to its device and dtype, and before building the optimizer.

    Args:
        model: an :class:`~attnlab.GPT` or :class:`~attnlab.Transformer` with attention
            ``"full"``, ``"sliding"`` or ``"bigbird"``, not yet distributed.
        mesh: a 1-D ``DeviceMesh`` of the tensor-parallel ranks, e.g.
            ``torch.distributed.device_mesh.init_device_mesh("cpu", (N,))``.

    Returns:
        ``model`` itself, sharded.

    Raises:
        TypeError: ``model`` is not a GPT or Transformer, or ``mesh`` not a ``DeviceMesh``.
        ValueError: a mesh that is not 1-D; ``num_heads``, ``num_kv_heads`` or the feed-forward
            width not divisible by the mesh size; an attention pattern that is not split by
            heads; a model already distributed.

    Examples:
        >>> mesh = init_device_mesh("cpu", (2,))  # doctest: +SKIP
        >>> model = parallelize(GPT(config), mesh)  # doctest: +SKIP
    """
    if not isinstance(mesh, DeviceMesh):
        raise ArgumentTypeError(f"mesh must be a torch DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim != 1:
        raise ArgumentError(f"mesh must be 1-D (the tensor-parallel ranks), got {mesh.ndim} dims")
    plan = tp_plan(model)
    n = mesh.size()
    _check_divisible(model, n)
    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise ArgumentError("model is already distributed (it holds DTensor parameters)")
    ties = _tied_parameters(model)
    with torch.no_grad():
        for p in model.parameters():
            # GPT lays fp32 matrices out (in, out) for batch-1 decoding; a DTensor keeps the
            # strides of what it was made from, and a non-contiguous one would take GPT.state_dict
            # down its de-duplication by data_ptr (0 for every DTensor). The local shards are
            # contiguous in any case.
            if not p.is_contiguous():
                p.data = p.data.contiguous()
    parallelize_module(model, mesh, plan)
    _retie(model, ties)
    plain = [name for name, p in model.named_parameters() if not isinstance(p, DTensor)]
    if plain:  # a module the plan does not know: better an error than silent divergence
        raise RuntimeError(f"tensor-parallel plan left parameters undistributed: {plain}")
    return model


def _check_divisible(model: nn.Module, n: int) -> None:
    """Heads, key/value heads and feed-forward widths divisible by ``n``, checked before
    anything changes."""
    if isinstance(model, GPT):
        cfg = model.config
        check_heads(cfg.n_head, cfg.kv_heads, n)
        widths = {"the MLP width (d_ff, default 4 · n_embd)": cfg.ff_width}
    else:
        c = cast(Transformer, model).config
        check_heads(c.num_heads, c.kv_heads, n)
        widths = {"d_ff": c.d_ff}
    for name, width in widths.items():
        if width % n:
            raise ArgumentError(
                f"{name} = {width} is not divisible by the tensor-parallel degree {n} (the mesh "
                f"size): the feed-forward units are split evenly"
            )


def _tied_parameters(model: nn.Module) -> list[list[str]]:
    """Names of parameters shared by several modules (``lm_head`` and the embedding)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _retie(model: nn.Module, ties: list[list[str]]) -> None:
    """Share again what was shared: each module got its own distributed copy."""
    for first, *others in ties:
        p = model.get_parameter(first)
        for name in others:
            path, _, attr = name.rpartition(".")
            owner = model.get_submodule(path)
            q = owner._parameters[attr]
            if not (isinstance(p, DTensor) and isinstance(q, DTensor)):
                raise RuntimeError(f"tied parameters {first} and {name} were not both distributed")
            if p.placements != q.placements:
                raise RuntimeError(
                    f"tied parameters {first} and {name} have different placements "
                    f"{p.placements} and {q.placements}"
                )
            owner.register_parameter(attr, p)


# ----------------------------------------------------------------------------------------------
# whole tensors in the single-process layout


def _qkv_orders(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{parameter name: row order}`` of every fused QKV weight and bias of a sharded model."""
    ids: dict[int, torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, TensorParallelAttention):
            for p in module.qkv_parameters():
                if p is not None:
                    ids[id(p)] = module.tp_qkv_order
    return {
        name: ids[id(p)]
        for name, p in model.named_parameters(remove_duplicate=False)
        if id(p) in ids
    }


def _whole(t: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """A DTensor gathered (a plain tensor as it is), its rows put back in order."""
    full = t.full_tensor() if isinstance(t, DTensor) else t
    if order is not None:
        full = full[order.argsort().to(full.device)]
    return full.contiguous()


def _shard_like(full: torch.Tensor, like: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """This rank's part of a whole tensor, laid out and placed as ``like`` (no communication)."""
    if order is not None:
        full = full[order.to(full.device)]
    full = full.to(dtype=like.dtype, device=like.device)
    if not isinstance(like, DTensor):
        return full
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)


def full_tensors(
    model: nn.Module, tensors: Mapping[str, torch.Tensor | None]
) -> dict[str, torch.Tensor | None]:
    """Gather tensors named like the model's parameters into whole tensors in the
    single-process layout (the fused QKV rows put back in order). A collective: every rank
    calls it, every rank gets the whole tensors.

    Works for parameters, their gradients and anything shaped like them (AdamW's
    ``exp_avg``/``exp_avg_sq``).

    Args:
        model: a model sharded by :func:`parallelize`.
        tensors: ``{name: tensor}`` with names of ``model.named_parameters()`` (or of its state
            dict); a DTensor is gathered, a plain tensor taken as it is, ``None`` kept.

    Returns:
        ``{name: whole tensor}``, each as the same model in one process holds it.

    Shape:
        each tensor: local shard → the parameter's full shape.

    Examples:
        >>> grads = full_tensors(model, {n: p.grad for n, p in model.named_parameters()})  # doctest: +SKIP
    """
    orders = _qkv_orders(model)
    return {name: None if t is None else _whole(t, orders.get(name)) for name, t in tensors.items()}


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as the same model in one process has it: every DTensor gathered,
    the fused QKV rows in their original order. A collective (every rank calls it).

    Args:
        model: a model sharded by :func:`parallelize`.

    Returns:
        ``{name: whole tensor}``, loadable by the unsharded model's ``load_state_dict`` (and by
        :func:`load_full_state_dict`).

    Shape:
        each tensor has its parameter's or buffer's full shape.
    """
    state = nn.Module.state_dict(model)  # as they are (GPT's own would de-duplicate by data_ptr)
    orders = _qkv_orders(model)
    return {name: _whole(t, orders.get(name)) for name, t in state.items()}


def load_full_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Load a single-process state dict (e.g. a checkpoint's ``model.safetensors``) into a
    sharded model: each rank copies its own shard out of the whole tensors, no communication.
    Every rank must pass the same tensors.

    Args:
        model: a model sharded by :func:`parallelize`.
        state_dict: ``{name: whole tensor}`` in the single-process layout, with the names of
            the model's state dict; of parameters shared by several names (``lm_head.weight``
            and the embedding) one name is enough, as ``safetensors`` stores them.

    Raises:
        KeyError: a name missing from ``state_dict`` or one the model does not have.
        ValueError: a tensor whose shape is not the parameter's.

    Shape:
        each tensor: the parameter's full shape.
    """
    orders = _qkv_orders(model)
    own = nn.Module.state_dict(model, keep_vars=True)
    given = set(state_dict)
    shared = {name for group in _tied_parameters(model) if given & set(group) for name in group}
    unexpected = sorted(given - set(own))
    missing = sorted(set(own) - given - shared)
    if unexpected or missing:
        raise KeyError(
            f"state_dict does not match the model: missing {missing}, unexpected {unexpected}"
        )
    with torch.no_grad():
        for name, target in own.items():
            if name not in state_dict:
                continue  # a tied name whose partner is given
            full = state_dict[name]
            if tuple(full.shape) != tuple(target.shape):
                raise ArgumentError(
                    f"{name} has shape {tuple(full.shape)} but the model's is {tuple(target.shape)}"
                )
            mine = _shard_like(full, target, orders.get(name))
            local_tensor(target).copy_(local_tensor(mine))


def _optimizer_names(model: nn.Module, optimizer: Optimizer) -> list[str]:
    """The model's name of each parameter of the optimizer, in ``optimizer.state_dict()``'s
    numbering (the param groups' parameters in order)."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise ArgumentError(
                    "optimizer holds a parameter that is not the model's: build the optimizer "
                    "after parallelize(model, mesh)"
                )
            out.append(names[id(p)])
    return out


def full_optimizer_state_dict(model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` as the same model's optimizer in one process has it: every
    per-parameter tensor (AdamW's ``exp_avg``, ``exp_avg_sq``) gathered whole, the fused QKV
    rows in their original order. A collective (every rank calls it).

    Args:
        model: a model sharded by :func:`parallelize`.
        optimizer: its optimizer (built after :func:`parallelize`).

    Returns:
        ``{"state": {index: {key: value}}, "param_groups": [...]}``, ``optimizer.state_dict()``'s
        layout with whole tensors; loadable by an unsharded model's optimizer and by
        :func:`load_full_optimizer_state_dict`.

    Shape:
        each per-parameter tensor has its parameter's full shape.
    """
    names = _optimizer_names(model, optimizer)
    orders = _qkv_orders(model)
    sd = optimizer.state_dict()
    state = {
        index: {
            key: _whole(value, orders.get(names[index])) if isinstance(value, DTensor) else value
            for key, value in entry.items()
        }
        for index, entry in sd["state"].items()
    }
    return {"state": state, "param_groups": sd["param_groups"]}


def load_full_optimizer_state_dict(
    model: nn.Module, optimizer: Optimizer, state_dict: Mapping[str, Any]
) -> None:
    """Load a single-process optimizer state dict (as :func:`full_optimizer_state_dict` or an
    unsharded run's ``optimizer.state_dict()`` gives it) into the optimizer of a sharded model:
    each rank keeps its own shard of every per-parameter tensor, no communication. Every rank
    must pass the same tensors.

    Args:
        model: a model sharded by :func:`parallelize`.
        optimizer: its optimizer (built after :func:`parallelize`).
        state_dict: ``{"state": {index: {key: value}}, "param_groups": [...]}``, the parameters
            numbered as in ``optimizer.state_dict()`` (the model's parameter order, when the
            optimizer was built from ``model.parameters()``).

    Raises:
        ValueError: the optimizer holds a parameter that is not the model's.

    Shape:
        each per-parameter tensor: its parameter's full shape.
    """
    names = _optimizer_names(model, optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    orders = _qkv_orders(model)
    state: dict[Any, Any] = {}
    for index, entry in state_dict["state"].items():
        p = params[int(index)]
        order = orders.get(names[int(index)])
        state[index] = {
            key: _shard_like(value, p, order)
            if isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(p.shape)
            else value
            for key, value in entry.items()
        }
    optimizer.load_state_dict({"state": state, "param_groups": state_dict["param_groups"]})
