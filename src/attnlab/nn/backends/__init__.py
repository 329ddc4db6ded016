"""The attention backends, as a registry: a name → a function with one signature.

Every backend takes validated inputs and a :class:`~attnlab.nn.mask_spec.Masking` in which every
query row has at least one visible key, and returns ``(output, weights | None)`` (the weights only
when ``need_weights``). :func:`attnlab.scaled_dot_product_attention` checks the arguments, handles
rows that may see no key, and calls the backend by name — so a new kernel is one
:func:`register_backend` call away from every module and model (as Hugging Face's
``AttentionInterface``). ``"auto"`` is not a backend but a choice among them, made per call
(:func:`choose_backend`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlab._checks import check_choice
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.nn.backends.blockwise import QUERY_BLOCK, blockwise_attention
from attnlab.nn.backends.flex import FLEX_BLOCK, flex_attention
from attnlab.nn.backends.math import math_attention
from attnlab.nn.backends.sdpa import sdpa_attention
from attnlab.nn.mask_spec import Masking

__all__ = [
    "ATTENTION_BACKENDS",
    "SOFTCAP_BACKENDS",
    "AttentionBackend",
    "backend_names",
    "blockwise_attention",
    "check_backend",
    "check_softcap",
    "choose_backend",
    "flex_attention",
    "get_backend",
    "math_attention",
    "register_backend",
    "sdpa_attention",
]

# (query, key, value, masking, scale, dropout_p, need_weights) -> (output, weights | None)
AttentionBackend = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, Masking, float, float, bool],
    tuple[torch.Tensor, torch.Tensor | None],
]

ATTENTION_BACKENDS: dict[str, AttentionBackend] = {
    "math": math_attention,
    "sdpa": sdpa_attention,
    "blockwise": blockwise_attention,
    "flex": flex_attention,
}


def backend_names() -> tuple[str, ...]:
    """Every name ``backend=`` accepts: ``"auto"`` and the registered backends.

    Returns:
        ``("auto", "math", "sdpa", "blockwise", "flex", ...)``, registered backends in registration order.
    """
    return ("auto", *ATTENTION_BACKENDS)


def check_backend(backend: object) -> str:
    """Check a ``backend=`` argument.

    Args:
        backend: what the caller passed.

    Returns:
        ``backend`` itself, when it names a registered backend or ``"auto"``.

    Raises:
        ValueError: ``backend`` is no such name (the message lists the names).
    """
    return check_choice("backend", backend, backend_names())


def choose_backend(
    backend: str,
    need_weights: bool,
    masking: Masking,
    t_q: int | None = None,
    t_k: int | None = None,
    device: torch.device | None = None,
) -> str:
    """The backend a call runs on: ``backend`` itself, or what ``"auto"`` picks for this call.

    ``"auto"`` picks, in this order:

    * ``"math"`` when the weights are asked for (it forms them anyway), or the scores are
      soft-capped (the one backend of :data:`SOFTCAP_BACKENDS` built in);
    * ``"flex"`` (PyTorch's FlexAttention, compiled) on CUDA under a block layout or a window
      that hides some key, for at least ``FLEX_BLOCK`` queries (a decoding step keeps the rules
      below: its one query row would compile a kernel per cache length);
    * ``"blockwise"`` under a block-sparse layout (``masking.blocks``, e.g. BigBird's): it visits
      only the visible tiles, where the others form the whole ``T_q × T_k`` score matrix;
    * ``"blockwise"`` under a sliding window whose band (plus one query block) is at most half
      the keys: it visits only the band's tiles, where the fused kernels take the window as a
      dense mask over all ``T_q × T_k`` scores (``T = 1024, w = 128``, forward + backward: 2.4x
      faster than full causal attention, where the dense-mask kernel is 1.5x slower);
    * ``"sdpa"`` (PyTorch's fused kernels) otherwise.

    Args:
        backend: a registered backend's name or ``"auto"``.
        need_weights: whether the caller wants the attention weights back.
        masking: the call's normalised mask (a layout that hides nothing has been dropped
            from it, so full attention keeps the fused kernel).
        t_q: number of queries (for the window rule; without lengths a window keeps ``"sdpa"``).
        t_k: number of keys.
        device: the inputs' device (``"flex"`` is chosen on CUDA only; ``None``: not CUDA).

    Returns:
        A registered backend's name.
    """
    if backend != "auto":
        return backend
    if need_weights or masking.softcap is not None:
        return "math"
    structured = masking.blocks is not None or masking.window is not None
    if structured and device is not None and device.type == "cuda" and (t_q or 0) >= FLEX_BLOCK:
        return "flex"
    if masking.blocks is not None:
        return "blockwise"
    if masking.window is not None and t_q is not None and t_k is not None:
        lo, hi = masking.bounds(t_q, t_k)
        if lo is not None and hi is not None and (hi - lo + 1) + QUERY_BLOCK <= t_k // 2:
            return "blockwise"
    return "sdpa"


#: the backends that apply a soft-capping of the scores (``Masking.softcap``) exactly; a
#: backend registered later that does adds its name here. The fused kernels (``sdpa``), the
#: tiles with their hand-written backward (``blockwise``) and FlexAttention (``flex``, whose
#: CPU and float64 calls fall back to ``blockwise``) refuse it.
SOFTCAP_BACKENDS: set[str] = {"math"}


def check_softcap(backend: str, masking: Masking) -> None:
    """Refuse soft-capped scores on a backend that would ignore the cap.

    Args:
        backend: the resolved backend's name.
        masking: the call's normalised mask (``softcap``).

    Raises:
        ArgumentError: one line naming the backend and those that soft-cap.
    """
    if masking.softcap is not None and backend not in SOFTCAP_BACKENDS:
        raise ArgumentError(
            f"backend must be one of {', '.join(sorted(SOFTCAP_BACKENDS))} or 'auto' for "
            f"soft-capped attention scores (softcap = {masking.softcap}), got {backend!r}"
        )


def get_backend(name: str) -> AttentionBackend:
    """The function registered under a backend's name.

    Args:
        name: a registered backend (``"auto"`` is resolved by the caller, not here).

    Returns:
        The backend function, ``fn(query, key, value, masking, scale, dropout_p, need_weights)``.

    Raises:
        ValueError: no backend is registered under ``name``.
    """
    fn = ATTENTION_BACKENDS.get(name) if isinstance(name, str) else None
    return fn or ATTENTION_BACKENDS[check_choice("backend", name, tuple(ATTENTION_BACKENDS))]


def register_backend(name: str, fn: AttentionBackend, *, replace: bool = False) -> None:
    """Make ``fn`` available as ``backend=name`` everywhere.

    Args:
        name: the backend's name; not ``"auto"``.
        fn: ``fn(query, key, value, masking, scale, dropout_p, need_weights) -> (output, weights)``
            with the shapes of :func:`~attnlab.nn.backends.math.math_attention`.
        replace: allow replacing a registered backend (built-ins included). Default ``False``.

    Raises:
        ValueError: ``name`` is ``"auto"``, empty, or already registered without ``replace``.
        TypeError: ``fn`` is not callable.
    """
    if not isinstance(name, str) or not name or name == "auto":
        raise ArgumentError(f"name must be a non-empty str other than 'auto', got {name!r}")
    if not callable(fn):
        raise ArgumentTypeError(f"fn must be callable, got {type(fn).__name__}")
    if name in ATTENTION_BACKENDS and not replace:
        raise ArgumentError(
            f"backend {name!r} is already registered; pass replace=True to replace it"
        )
    ATTENTION_BACKENDS[name] = fn
