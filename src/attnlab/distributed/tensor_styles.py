"""The pieces of tensor parallelism (:mod:`attnlab.distributed.tensor_parallel`): the parallel
styles of an attention layer (:class:`HeadParallel`) and of a replicated module
(:class:`ReplicateParallel`), the attention layer that holds ``H/N`` heads, and the fused QKV's
row order (:func:`qkv_row_order`).

The fused ``[W^Q; W^K; W^V]`` (``(H + 2 · H_kv) · d_head`` rows) is permuted before it is
sharded ``Shard(0)``: its rows become ``[W^Q_0; W^K_0; W^V_0; W^Q_1; …]``, so that rank ``r`` holds
the rows of its own query heads ``[r · H/N, (r+1) · H/N)`` and key/value heads
``[r · H_kv/N, (r+1) · H_kv/N)`` — the fused weight of a layer with ``H/N`` and ``H_kv/N`` heads —
rather than a contiguous ``1/N`` of the matrix (rank 0 of 2 would get all of ``W^Q`` and none of
``W^K``, ``W^V``). Query head ``h`` reads key/value head ``h // (H / H_kv)``: the same rank's.

In the forward pass each rank projects the whole input with its rows (Megatron's ``f``: the
identity forward, and backward the all-reduce of the partial input gradients), attends over
its heads, and multiplies its heads' outputs by its columns of ``W^O`` (row parallel): the
ranks' partial sums are all-reduced there (``RowwiseParallel``'s output, Megatron's ``g``).
"""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import ParallelStyle

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.models.gpt import GPTSelfAttention
from attnlab.nn.block_layout import BlockLayout
from attnlab.nn.head_mask import check_head_mask
from attnlab.nn.kv_cache import LayerCache
from attnlab.nn.masks import Window
from attnlab.nn.multihead import MultiHeadAttention
from attnlab.training.processes import local_tensor

__all__ = ["HeadParallel", "ReplicateParallel", "TensorParallelAttention", "qkv_row_order"]

# ----------------------------------------------------------------------------------------------
# the fused QKV's row order


def qkv_row_order(num_heads: int, num_kv_heads: int, d_head: int, degree: int) -> torch.Tensor:
    """The permutation of a fused ``[W^Q; W^K; W^V]`` that puts each rank's heads together.

    Row ``i`` of the re-laid-out matrix is row ``order[i]`` of the original: the rows become
    ``[W^Q_0; W^K_0; W^V_0; W^Q_1; W^K_1; W^V_1; …]``, ``W^Q_r`` the rows of query heads
    ``[r · H/N, (r+1) · H/N)`` and ``W^K_r``, ``W^V_r`` those of key/value heads
    ``[r · H_kv/N, (r+1) · H_kv/N)``, so that ``Shard(0)`` hands rank ``r`` the fused weight of its
    own heads. ``original = relaid[order.argsort()]``.

    Args:
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads ``H_kv``.
        d_head: width of one head.
        degree: tensor-parallel degree ``N``; must divide ``H`` and ``H_kv``.

    Returns:
        A permutation of ``range((H + 2 · H_kv) · d_head)``, int64.

    Raises:
        ValueError: ``N`` does not divide ``H`` or ``H_kv``.

    Shape:
        ``((H + 2 · H_kv) · d_head,)``.

    Examples:
        >>> qkv_row_order(2, 2, 1, 2).tolist()  # rows q0 q1 k0 k1 v0 v1
        [0, 2, 4, 1, 3, 5]
    """
    check_heads(num_heads, num_kv_heads, degree)
    q, kv = num_heads * d_head, num_kv_heads * d_head
    q_r, kv_r = q // degree, kv // degree
    pieces = []
    for r in range(degree):
        pieces.append(torch.arange(r * q_r, (r + 1) * q_r))  # W^Q_r
        pieces.append(q + torch.arange(r * kv_r, (r + 1) * kv_r))  # W^K_r
        pieces.append(q + kv + torch.arange(r * kv_r, (r + 1) * kv_r))  # W^V_r
    return torch.cat(pieces)


def check_heads(num_heads: int, num_kv_heads: int, degree: int) -> None:
    """Refuse head counts that ``degree`` ranks cannot share out whole.

    Args:
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads ``H_kv``.
        degree: tensor-parallel degree ``N``.

    Raises:
        ValueError: ``N`` does not divide ``H`` or ``H_kv`` (the message names both numbers).
    """
    if num_heads % degree:
        raise ArgumentError(
            f"num_heads = {num_heads} is not divisible by the tensor-parallel degree {degree} "
            f"(the mesh size): each rank must hold num_heads / {degree} whole heads"
        )
    if num_kv_heads % degree:
        raise ArgumentError(
            f"num_kv_heads = {num_kv_heads} is not divisible by the tensor-parallel degree "
            f"{degree} (the mesh size): each rank must hold whole key/value heads, and the query "
            f"heads of a group live on the rank of their key/value head"
        )


# ----------------------------------------------------------------------------------------------
# Megatron's f: identity forward, all-reduce of the gradient backward


def _copy_to_tp(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """``x`` unchanged; in the backward pass the ranks' partial gradients are summed (the
    gradient with respect to an input that every rank projects with its own columns)."""
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(
        grad_placements=[Partial()]
    )


# ----------------------------------------------------------------------------------------------
# an attention layer with its rank's heads


class TensorParallelAttention(MultiHeadAttention):
    """A :class:`~attnlab.nn.multihead.MultiHeadAttention` that holds ``H/N`` of the heads.

    Not constructed directly: :class:`HeadParallel` switches a built layer's class to this one
    (GPT's self-attention to a subclass of both this and
    :class:`~attnlab.models.gpt.GPTSelfAttention`), so ``isinstance(layer,
    TensorParallelAttention)`` tells a sharded layer. Its parameters are those of the layer it
    was built as.

    Attributes:
        num_heads: this rank's query heads ``H/N``.
        num_kv_heads: this rank's key/value heads ``H_kv/N``.
        d_model: the model width, as before (inputs and outputs are whole on every rank); the
            local projections are ``num_heads · d_head`` and ``num_kv_heads · d_head`` wide.
        tp_num_heads: the layer's heads ``H``.
        tp_num_kv_heads: the layer's key/value heads ``H_kv``.
        tp_mesh: the device mesh.
        tp_rank: this rank's place on it ``r`` (it holds query heads ``[r · H/N, (r+1) · H/N)``).
        tp_degree: the mesh size ``N``.
        tp_qkv_order: the fused QKV's row order (:func:`qkv_row_order`).

    Shape:
        query ``(B, T_q, d_model)`` → ``(B, T_q, d_model)``; weights ``(B, H/N, T_q, T_k)``.
    """

    tp_mesh: DeviceMesh
    tp_rank: int
    tp_degree: int
    tp_num_heads: int
    tp_num_kv_heads: int
    tp_qkv_order: torch.Tensor

    def __init__(self) -> None:
        raise ArgumentTypeError(
            "TensorParallelAttention is not built directly: shard a built layer with "
            "HeadParallel (attnlab.distributed.tensor_parallel.parallelize does it for a model)"
        )

    def forward(  # type: ignore[override]
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        is_causal: bool | None = None,
        need_weights: bool = False,
        cache: LayerCache | None = None,
        positions: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        check_positions: bool = True,
        window: Window = None,
        block_mask: BlockLayout | Literal[False] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """:meth:`MultiHeadAttention.forward` over this rank's heads; a per-head ``mask``
        (``(…, H, T_q, T_k)``, e.g. ALiBi's) and ``head_mask`` are given for all ``H`` heads.

        Args:
            query: ``(B, T_q, d_model)``, the same on every rank.
            key: ``(B, T_k, d_model)`` or ``None`` for self-attention.
            value: ``(B, T_k, d_model)``; default ``key``.
            mask: broadcastable to ``(B, H, T_q, T_k)`` (``H`` all the heads).
            is_causal: as the base layer.
            need_weights: also return this rank's heads' weights.
            cache: a KV cache (e.g. :class:`~attnlab.nn.kv_cache.KVCache`) of ``H_kv/N`` heads.
            positions: rotary position ids.
            head_mask: broadcastable to ``(B, H)`` (``H`` all the heads).
            check_positions: as the base layer.
            window: as the base layer.
            block_mask: as the base layer.

        Returns:
            ``output`` ``(B, T_q, d_model)`` (whole, after the all-reduce of the output
            projection), or ``(output, weights)`` with the weights of this rank's heads.

        Shape:
            query ``(B, T_q, d_model)`` → ``(B, T_q, d_model)``; weights ``(B, H/N, T_q, T_k)``.
        """
        return super().forward(
            query,
            key,
            value,
            mask=self._local_mask(mask),
            is_causal=is_causal,
            need_weights=need_weights,
            cache=cache,
            positions=positions,
            # ablations are given for all H heads: applied here, before the rank's cut
            head_mask=self._local_head_mask(
                MultiHeadAttention._ablated(self, head_mask), query.shape[0]
            ),
            check_positions=check_positions,
            window=window,
            block_mask=block_mask,
        )

    def _ablated(self, head_mask: torch.Tensor | None) -> torch.Tensor | None:
        """As given: :meth:`forward` applied the ablations (for all ``H`` heads) before its cut."""
        return head_mask

    def _heads(self) -> slice:
        h = self.num_heads
        return slice(self.tp_rank * h, (self.tp_rank + 1) * h)

    def _local_mask(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        """A mask with a head dimension of all ``H`` heads → this rank's heads."""
        if not isinstance(mask, torch.Tensor) or mask.dim() < 3:
            return mask
        if mask.shape[-3] == self.tp_num_heads != self.num_heads:
            heads = self._heads()
            return mask.narrow(-3, heads.start, self.num_heads)
        return mask

    def _local_head_mask(self, head_mask: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        """A head mask for all ``H`` heads (checked as such) → ``(B or 1, H/N)``."""
        if head_mask is None:
            return None
        m = check_head_mask(head_mask, batch, self.tp_num_heads)[:, :, 0, 0]  # (B or 1, H or 1)
        return m if m.shape[1] == 1 else m[:, self._heads()]

    def _local_rows(self, x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """``x`` times rows ``[lo, hi)`` of this rank's fused weight (plus bias); the gradient
        with respect to ``x`` is summed over the ranks."""
        w, b = self.qkv_parameters()
        w_r, b_r = local_tensor(w)[lo:hi], None if b is None else local_tensor(b)[lo:hi]
        return F.linear(_copy_to_tp(x, self.tp_mesh), w_r, b_r)

    def fused_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """``x [W^Q_r; W^K_r; W^V_r]ᵀ + b_r``: this rank's heads' projections in one matmul.

        Args:
            x: the activations, whole on every rank.

        Returns:
            This rank's ``[Q, K, V]``, heads still merged.

        Shape:
            ``(B, T, d_model)`` → ``(B, T, (H + 2 · H_kv) · d_head / N)``.
        """
        w, _ = self.qkv_parameters()
        return self._local_rows(x, 0, local_tensor(w).shape[0])

    def project_qkv(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        project_kv: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """This rank's ``Q``, ``K``, ``V``: the local fused projection split by the local widths
        ``H/N · d_head`` and ``H_kv/N · d_head``.

        Args:
            query: the activations the queries come from.
            key: the activations the keys come from, or ``None`` for self-attention.
            value: the activations the values come from; default ``key``.
            project_kv: compute ``K`` and ``V`` (default ``True``); ignored for self-attention.

        Returns:
            ``(q, k, v)``; ``k`` and ``v`` are ``None`` when ``project_kv`` is false.

        Shape:
            query ``(B, T_q, d_model)`` → ``q`` ``(B, T_q, H/N · d_head)``, ``k``, ``v``
            ``(B, T_k, H_kv/N · d_head)``.
        """
        d, kv = self.num_heads * self.d_head, self.num_kv_heads * self.d_head
        if key is None:
            q, k, v = self.fused_qkv(query).split([d, kv, kv], dim=-1)
            return q, k, v
        q = self._local_rows(query, 0, d)
        if not project_kv:
            return q, None, None
        k = self._local_rows(key, d, d + kv)
        return q, k, self._local_rows(key if value is None else value, d + kv, d + 2 * kv)


class _TensorParallelGPTSelfAttention(TensorParallelAttention, GPTSelfAttention):
    """GPT's self-attention holding ``H/N`` heads: ``c_attn`` is column parallel
    (``ColwiseParallel``, rows re-laid out), ``c_proj`` row parallel (``RowwiseParallel``)."""

    def fused_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """``c_attn(x)``: ``ColwiseParallel`` returns this rank's columns.

        Args:
            x: the block's input after ``ln_1``, whole on every rank.

        Returns:
            This rank's ``[Q, K, V]``, heads still merged.

        Shape:
            ``(B, T, n_embd)`` → ``(B, T, (H + 2 · H_kv) · d_head / N)``.
        """
        return GPTSelfAttention.fused_qkv(self, x)


#: the layers :class:`HeadParallel` shards (exact types) and the classes they become
_SHARDED_CLASSES: dict[type[nn.Module], type[TensorParallelAttention]] = {
    MultiHeadAttention: TensorParallelAttention,
    GPTSelfAttention: _TensorParallelGPTSelfAttention,
}


# ----------------------------------------------------------------------------------------------
# the parallel styles


class HeadParallel(ParallelStyle):
    """Shard an attention layer by heads: it keeps ``H/N`` query and ``H_kv/N`` key/value heads.

    Applied to a :class:`~attnlab.nn.multihead.MultiHeadAttention` or a
    :class:`~attnlab.models.gpt.GPTSelfAttention` (the exact types; subclasses that replace the
    attention, Performer and Linformer, are refused), before its projections' own styles:

    1. the fused ``[W^Q; W^K; W^V]`` rows (and bias) are permuted by :func:`qkv_row_order`, so
       that ``Shard(0)`` gives each rank its heads' rows;
    2. a fused weight the layer holds itself (``in_proj_weight``/``in_proj_bias``) is
       distributed ``Shard(0)`` here; one in a ``nn.Linear`` (GPT's ``c_attn``) is left to the
       plan's ``ColwiseParallel`` for it. The output projection (``out_proj``/``c_proj``) is left
       to the plan's ``RowwiseParallel``;
    3. the layer's ``num_heads``/``num_kv_heads`` become the local counts and its class a
       subclass that projects and merges heads with the local widths.

    Its ``forward`` then takes the whole input on every rank and returns the whole output; its
    attention weights are those of its own heads.

    Shape:
        query ``(B, T_q, d_model)`` → ``(B, T_q, d_model)`` on every rank.

    Examples:
        >>> plan = {"attn": HeadParallel(), "attn.c_attn": ColwiseParallel(),
        ...         "attn.c_proj": RowwiseParallel()}  # doctest: +SKIP
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        cls = _SHARDED_CLASSES.get(type(module))
        if cls is None:
            names = ", ".join(c.__name__ for c in _SHARDED_CLASSES)
            raise ArgumentTypeError(
                f"HeadParallel shards {names} layers, got {type(module).__name__} (attention "
                f"that replaces softmax attention is not split by heads here)"
            )
        attn = cast(MultiHeadAttention, module)
        n, rank = device_mesh.size(), device_mesh.get_local_rank()
        h, h_kv = attn.num_heads, attn.num_kv_heads
        order = qkv_row_order(h, h_kv, attn.d_head, n)
        weight, bias = attn.qkv_parameters()
        own = {id(p): name for name, p in attn.named_parameters(recurse=False)}
        with torch.no_grad():
            for p in (weight, bias):
                if p is None:
                    continue
                if isinstance(p, DTensor):
                    raise ArgumentError(f"{type(module).__name__} is already distributed")
                p.data = p.data[order.to(p.device)]  # rows of rank 0, then rank 1, …
                if id(p) in own:  # in_proj_weight / in_proj_bias: distributed here
                    sharded = distribute_tensor(
                        p.data, device_mesh, [Shard(0)], src_data_rank=self.src_data_rank
                    )
                    attn.register_parameter(
                        own[id(p)], nn.Parameter(sharded, requires_grad=p.requires_grad)
                    )
        attn.__class__ = cls
        tp = cast(TensorParallelAttention, attn)
        tp.tp_mesh, tp.tp_rank, tp.tp_degree = device_mesh, rank, n
        tp.tp_num_heads, tp.tp_num_kv_heads, tp.tp_qkv_order = h, h_kv, order
        tp.num_heads, tp.num_kv_heads = h // n, h_kv // n
        return tp

    def __repr__(self) -> str:
        return "HeadParallel()"


class ReplicateParallel(ParallelStyle):
    """Replicate a module's parameters on every rank as ``Replicate`` DTensors (taken from rank
    0), and run it on plain tensors: its tensor inputs become ``Replicate`` DTensors and its
    output a plain tensor again.

    For the modules outside the sharded blocks (embeddings, LayerNorms, the LM head): they
    compute the same thing on every rank, and their gradients are whole on every rank. Making
    their parameters DTensors too lets ``clip_grad_norm_``, optimizers and distributed
    checkpoints treat all parameters alike.

    Shape:
        any input → the module's output, unchanged, on every rank.

    Examples:
        >>> plan = {"ln_f": ReplicateParallel()}  # doctest: +SKIP
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        src = self.src_data_rank

        def partition(name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for pname, p in list(mod.named_parameters(recurse=False)):
                if isinstance(p, DTensor):
                    continue
                rep = distribute_tensor(p.data, mesh, [Replicate()], src_data_rank=src)
                mod.register_parameter(pname, nn.Parameter(rep, requires_grad=p.requires_grad))

        def inputs(mod: nn.Module, args: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
            return tuple(
                DTensor.from_local(a, mesh, [Replicate()], run_check=False)
                if isinstance(a, torch.Tensor) and not isinstance(a, DTensor)
                else a
                for a in args
            )

        def output(mod: nn.Module, out: Any, mesh: DeviceMesh) -> Any:
            return out.to_local() if isinstance(out, DTensor) else out

        # distribute_module's annotations say the hooks return None; their results replace the
        # module's inputs and output, as torch's own styles use them
        return distribute_module(module, device_mesh, partition, cast(Any, inputs), output)

    def __repr__(self) -> str:
        return "ReplicateParallel()"
