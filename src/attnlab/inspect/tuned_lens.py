"""The tuned lens (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the
Tuned Lens"): one affine translator a layer, trained so that the layer's lens matches the model's
final distribution.

Row ``l``'s state (0 = the embeddings, ``l`` = after block ``l − 1``) is mapped before the
model's final norm and unembedding (:mod:`attnlab.inspect.lens`),

    tuned_l(h) = W_U · Norm_f(h + A_l h + b_l),

with ``A_l`` and ``b_l`` initialised to zero (the identity: the logit lens) and trained to
minimise ``KL(p_L ‖ tuned_l)``, the distillation loss of the paper, averaged over tokens. The last
row has no translator: it is the model's output. The model itself is frozen: only ``A_l``,
``b_l`` learn (Adam; the paper uses SGD with Nesterov momentum over far more tokens).

A lens is saved as a folder, as a run is: ``tuned_lens.safetensors`` (the translators) and
``config.json`` (its shape, how it was trained, and a fingerprint of the model's final norm and
unembedding); :func:`load_tuned_lens` refuses in one line a lens made for another model.

An encoder-decoder (:class:`~attnlab.Transformer`) has a tuned lens of its decoder: one translator
for the target embeddings and each decoder layer but the last, before ``decoder.norm`` and
``lm_head`` (:func:`~attnlab.inspect.lens.lens_stack`); it is trained on pairs of source rows and
decoder inputs, its KL averaged over the target positions that are not padding.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from attnlab._checks import check_positive_int, check_seed, check_tensor, read_small_json
from attnlab._files import replace_folder, safetensors_bytes, write_synced
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect.lens import LensStack, _evaluating, _ids, lens_stack, record_stream

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "TunedLens",
    "load_tuned_lens",
    "train_tuned_lens",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "tuned_lens.safetensors"
FORMAT = "attnlab-tuned-lens"
VERSION = 1


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of what a lens reads through: the final norm's and the unembedding's shapes
    and values (the first rows), in float32; equal for the same weights in any dtype that holds
    them exactly.

    Args:
        model: an :class:`attnlab.GPT` or an :class:`attnlab.Transformer`.

    Returns:
        16 hex digits.
    """
    stack = _stack_of(model)
    h = hashlib.sha256()
    for module in (stack.norm, stack.head):
        for name, p in sorted(module.named_parameters()):
            h.update(f"{name}{tuple(p.shape)}".encode())
            h.update(p.detach()[:64].float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _seq2seq(model: nn.Module) -> bool:
    """Whether ``model`` is an encoder-decoder (its decoder is read); a GPT gives ``False``.

    Raises:
        TypeError: neither.
    """
    from attnlab.models.gpt import GPT
    from attnlab.models.transformer import Transformer

    if isinstance(model, Transformer):
        return True
    if not isinstance(model, GPT):
        raise ArgumentTypeError(
            f"model must be an attnlab.GPT or an attnlab.Transformer (its decoder), got "
            f"{type(model).__name__}"
        )
    return False


def _stack_of(model: nn.Module) -> LensStack:
    zero = torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device)
    return lens_stack(model, zero, zero if _seq2seq(model) else None)


def _shape_of(model: nn.Module) -> tuple[int, int, int, str]:
    """The lens's shape for ``model``: blocks (a decoder's layers), width, vocabulary, family."""
    seq2seq = _seq2seq(model)  # first: refuses another kind of model
    cfg: Any = model.config
    if seq2seq:
        return cfg.num_decoder_layers, cfg.d_model, cfg.tgt_vocab_size, "transformer"
    return cfg.n_layer, cfg.n_embd, cfg.vocab_size, cfg.family


class TunedLens(nn.Module):
    """One affine translator ``h ↦ h + A_l h + b_l`` for each row but the last.

    Args:
        n_layer: the model's blocks ``L`` (``L`` translators: the embeddings and blocks
            ``0 … L − 2``; block ``L − 1``'s output is the model's own).
        d_model: the residual stream's width.
        config: what :attr:`config` holds besides the shape (the model it fits, how it was
            trained).

    Shape:
        :meth:`translate`: h ``(..., d_model)`` → ``(..., d_model)``.
    """

    def __init__(self, n_layer: int, d_model: int, config: dict[str, Any] | None = None) -> None:
        super().__init__()
        check_positive_int("n_layer", n_layer)
        check_positive_int("d_model", d_model)
        self.translators = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(n_layer))
        for row in range(n_layer):  # the identity: the logit lens (Belrose et al. 2023, §3)
            nn.init.zeros_(self._linear(row).weight)
            nn.init.zeros_(self._linear(row).bias)
        self.config: dict[str, Any] = {
            **(config or {}),
            "format": FORMAT,
            "version": VERSION,
            "n_layer": n_layer,
            "d_model": d_model,
        }

    def _linear(self, row: int) -> nn.Linear:
        return cast(nn.Linear, self.translators[row])

    @classmethod
    def for_model(cls, model: nn.Module) -> TunedLens:
        """An identity lens shaped for ``model`` (an :class:`attnlab.GPT`, or an
        :class:`attnlab.Transformer`'s decoder), on its device.

        Args:
            model: the model.

        Returns:
            :class:`TunedLens`.
        """
        n_layer, d_model, vocab, family = _shape_of(model)
        fingerprint = model_fingerprint(model)
        lens = cls(n_layer, d_model, {"vocab_size": vocab, "family": family, "model": fingerprint})
        return lens.to(next(model.parameters()).device)

    def translate(self, h: torch.Tensor, row: int) -> torch.Tensor:
        """Row ``row``'s state translated: ``h + A_row h + b_row`` (``h`` itself for the last
        row).

        Args:
            h: the residual stream.
            row: 0 = the embeddings, ``l`` = after block ``l − 1``.

        Returns:
            The translated state, in ``h``'s dtype.

        Shape:
            h ``(..., d_model)`` → ``(..., d_model)``.
        """
        if row >= len(self.translators):
            return h
        t = self._linear(row)
        # h + A h + b
        return h + nn.functional.linear(h, t.weight.to(h.dtype), t.bias.to(h.dtype))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the lens as a folder: ``tuned_lens.safetensors`` and ``config.json``, replaced
        together.

        Args:
            path: the folder (made when missing).

        Returns:
            The folder.
        """
        tensors = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        weights = safetensors_bytes(tensors, metadata={"format": FORMAT})
        config = json.dumps(self.config, indent=2).encode()

        def write(stage: Path) -> None:
            write_synced(stage / WEIGHTS_FILE, weights)
            write_synced(stage / CONFIG_FILE, config)

        return replace_folder(Path(path), write, lambda name: name in (WEIGHTS_FILE, CONFIG_FILE),
                              CONFIG_FILE)  # fmt: skip


def load_tuned_lens(path: str | os.PathLike[str], model: nn.Module) -> TunedLens:
    """Read a lens :meth:`TunedLens.save` wrote, checked against ``model``.

    Args:
        path: the folder.
        model: the model it will read (an :class:`attnlab.GPT`, or a Transformer: its decoder).

    Returns:
        :class:`TunedLens`, on the model's device.

    Raises:
        ValueError: one line: not a tuned-lens folder, a damaged file, or a lens made for
            another model (its layers, width, vocabulary or weights).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from attnlab.training.manifest import CheckpointError

    folder = Path(path)
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise CheckpointError(f"{folder} is not a tuned lens: no {CONFIG_FILE}")
    cfg = read_small_json(config_file)
    if cfg.get("format") != FORMAT:
        raise CheckpointError(f"{config_file} is not a tuned lens's (format {cfg.get('format')!r})")
    ours = TunedLens.for_model(model).config
    for key in ("n_layer", "d_model", "vocab_size", "model"):
        if cfg.get(key) != ours[key]:
            what = "weights (fingerprint)" if key == "model" else key
            raise ArgumentError(
                f"the tuned lens {folder} was trained for another model: its {what} is "
                f"{cfg.get(key)!r}, this model's is {ours[key]!r}"
            )
    try:
        tensors = load_file(str(folder / WEIGHTS_FILE))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{folder / WEIGHTS_FILE}: {str(exc).splitlines()[0]}") from None
    lens = TunedLens(cfg["n_layer"], cfg["d_model"], cfg)
    expected = {k: tuple(v.shape) for k, v in lens.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if got != expected:
        raise CheckpointError(f"{folder / WEIGHTS_FILE} does not hold the translators its "
                              f"{CONFIG_FILE} describes")  # fmt: skip
    lens.load_state_dict(tensors)
    return lens.to(next(model.parameters()).device)


def _windows(data: torch.Tensor, seq_len: int, batch_size: int, g: torch.Generator) -> torch.Tensor:
    """``batch_size`` random windows of ``seq_len`` tokens of a 1-D text, or random rows.

    Shape:
        data ``(N,)`` or ``(R, T)`` → ``(batch_size, seq_len)`` (``(batch_size, T)`` for rows).
    """
    if data.shape[0] == 1 and data.shape[1] > seq_len:
        data = data[0]
    if data.dim() == 2:
        return data[torch.randint(0, data.shape[0], (batch_size,), generator=g)]
    starts = torch.randint(0, data.shape[0] - seq_len + 1, (batch_size,), generator=g)
    return torch.stack([data[s : s + seq_len] for s in starts.tolist()])


def _pairs(data: object, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """An encoder-decoder's training data: ``(source rows, decoder input rows)``, checked.

    Shape:
        ``(R, S)`` and ``(R, T)``.
    """
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ArgumentTypeError(
            "data must be a pair (source_ids, target_ids) of (R, S) and (R, T) rows for an "
            f"encoder-decoder, got {type(data).__name__}"
        )
    src, tgt = (
        _ids("data[0] (source_ids)", data[0], model),
        _ids("data[1] (target_ids)", data[1], model),
    )
    if src.shape[0] != tgt.shape[0]:
        raise ArgumentError(
            f"data's source and target rows must pair up, got {src.shape[0]} and {tgt.shape[0]}"
        )
    return src, tgt


def train_tuned_lens(
    model: nn.Module,
    data: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    *,
    steps: int = 100,
    seq_len: int = 128,
    batch_size: int = 4,
    lr: float = 1e-3,
    seed: int = 0,
    lens: TunedLens | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> TunedLens:
    """Train one translator a layer so that each layer's lens matches the final distribution.

    Each step takes ``batch_size`` random windows of ``seq_len`` tokens of ``data`` (an
    encoder-decoder: random pairs of rows, whole; padded target positions do not count), runs the
    frozen model once (recording every row's state and its log-probabilities ``log p_L``), and
    for each row ``l < L`` minimises ``mean_tokens KL(p_L ‖ softmax(W_U Norm_f(h + A_l h +
    b_l)))`` by Adam; one row's graph is freed before the next (the unembedding's logits of one
    layer exist at a time).

    Args:
        model: an :class:`attnlab.GPT`, or an :class:`attnlab.Transformer` (its decoder); its
            parameters are not changed.
        data: token ids: one text ``(N,)`` (random windows) or rows ``(R, T)`` (random rows);
            for a Transformer a pair ``(source_ids, target_ids)`` of rows (the decoder's
            inputs: ``<bos> y_1 …``, padded with ``pad_id``).
        steps: optimizer steps (default 100).
        seq_len: tokens a window (default 128; a Transformer's rows are taken whole).
        batch_size: windows a step (default 4).
        lr: Adam's learning rate (default 1e-3).
        seed: the windows' random seed.
        lens: a lens to continue training (default a new identity lens).
        on_step: called after each step with the step (1-based) and its mean KL (nats, over
            the layers).

    Returns:
        The trained :class:`TunedLens`; its ``config["trained"]`` says how.

    Raises:
        ValueError: ``data`` shorter than ``seq_len``, a lens for another model; a Transformer's
            source and target rows that do not pair up.
        TypeError: neither a GPT nor a Transformer; ``data`` not integer ids (a Transformer's
            not a pair).

    Shape:
        data ``(N,)`` or ``(R, T)``; a Transformer's ``((R, S), (R, T))``.
    """
    stack0 = _stack_of(model)
    seq2seq = _seq2seq(model)
    if not seq2seq:
        check_tensor("data", data)
    for name, value in (("steps", steps), ("seq_len", seq_len), ("batch_size", batch_size)):
        check_positive_int(name, value)
    check_seed("seed", seed)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
        raise ArgumentError(f"lr must be a positive finite number, got {lr!r}")
    if seq2seq:
        src, ids = _pairs(data, model)
        cfg: Any = model.config
        pad = int(cfg.pad_id)
    else:
        ids = _ids("data", data, model)
    if not seq2seq and ids.shape[0] == 1 and ids.shape[1] < seq_len:
        raise ArgumentError(f"data has {ids.shape[1]} tokens, fewer than seq_len = {seq_len}")
    if lens is None:
        lens = TunedLens.for_model(model)
    elif lens.config.get("model") != model_fingerprint(model):
        raise ArgumentError("lens was made for another model (its fingerprint differs)")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(lens.parameters(), lr=lr)
    frozen = [p for p in model.parameters() if p.requires_grad]
    n_rows = len(stack0.names)
    last = 0.0
    try:
        for p in frozen:
            p.requires_grad_(False)
        lens.train()
        for step in range(1, steps + 1):
            if seq2seq:
                rows = torch.randint(0, ids.shape[0], (batch_size,), generator=g).to(ids.device)
                stack = lens_stack(model, src[rows], ids[rows])
                counted = (ids[rows] != pad).float()  # the target positions that count
            else:
                batch = _windows(ids.cpu(), seq_len, batch_size, g).to(ids.device)
                stack = lens_stack(model, batch)
                counted = None  # every token
            final, states = record_stream(stack, model)
            log_p = torch.log_softmax(final.float(), dim=-1)
            p_final = log_p.exp()
            opt.zero_grad(set_to_none=True)
            total = 0.0
            with _evaluating(model):
                for row in range(n_rows - 1):
                    z = stack.logits(lens.translate(states[row], row)).float()
                    # KL(p_L ‖ q_l) = Σ_v p_L (log p_L − log q_l), mean over the counted tokens
                    per_token = (p_final * (log_p - torch.log_softmax(z, dim=-1))).sum(-1)
                    if counted is None:
                        kl = per_token.mean()
                    else:
                        kl = (per_token * counted).sum() / counted.sum().clamp(min=1)
                    kl.backward()
                    total += float(kl.detach())
            opt.step()
            last = total / max(n_rows - 1, 1)
            if on_step is not None:
                on_step(step, last)
    finally:
        for p in frozen:
            p.requires_grad_(True)
        lens.eval()
    done = lens.config.get("trained", {}).get("steps", 0)
    lens.config["trained"] = {
        "steps": done + steps, "seq_len": seq_len, "batch_size": batch_size, "lr": lr,
        "seed": seed, "final_mean_kl_nats": last,
    }  # fmt: skip
    return lens
