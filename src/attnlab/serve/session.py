"""One loaded language model behind ``attnlab serve``: what each endpoint computes, through the
library's own functions (the page adds no numerics of its own).

* the attention of every layer and head: :func:`attnlab.tasks.figures.capture_inputs` and
  :func:`~attnlab.tasks.figures.viewer_for`, the payload and page of ``attnlab view``;
* one head step by step: :func:`attnlab.viz.step_panel_from_model`, as ``attnlab plot steps``;
* the next token's distribution: :func:`attnlab.decoding.strategies.sampling_distribution` of the
  last logits, the tensor ``attnlab generate`` samples from;
* generation: :meth:`attnlab.tasks.lm.LMIO.generate`, the path ``attnlab generate`` takes, so a
  seed gives the same tokens as ``attnlab generate --seed``.

A :class:`Session` holds one lock: calls that run the model are serialised (several tabs queue,
never interleave on one model). What one text's forward gives (its capture, its last logits, the
head card's mixing and lens) is kept in a bounded cache keyed by the token ids
(:meth:`Session.remember`, the :data:`CACHE_SIZE` latest), so the page's view, next-token bars and
card of one text, and every slider move, do not run the model again.
"""

from __future__ import annotations

import base64
import io
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from attnlab._budget import format_bytes
from attnlab.decoding.scores import Generation
from attnlab.decoding.strategies import sampling_distribution
from attnlab.inspect.capture import ActivationCache, attention_modules
from attnlab.models.config import GPTConfig
from attnlab.serve.requests import FieldError, Sampling
from attnlab.tasks.base import ModelInputs, token_labels
from attnlab.tasks.figures import capture_inputs, viewer_for
from attnlab.tasks.lm import LMIO
from attnlab.tasks.token_scores import TokenScore, token_scores
from attnlab.viz.steps import step_data_from_model, step_panel_from_model
from attnlab.viz.viewer import ViewerData
from attnlab.viz.viewer_start import ViewerStart

__all__ = ["CACHE_SIZE", "DEFAULT_MAX_TOKENS", "MAX_PAGE_BYTES", "Session"]

T = TypeVar("T")

#: the longest sequence (prompt and generated tokens) the server runs by default: its page holds
#: ``layers · heads · T²`` weights (SmolLM2-135M, 270 heads, 128 tokens: about 24 MB of base64)
DEFAULT_MAX_TOKENS = 128
#: the largest viewer page a request may ask for (``attnlab view``'s bound: a browser does not
#: open much more), as base64 float32 weights: 16/3 bytes each
MAX_PAGE_BYTES = 200 * 10**6
#: the results of one text's forward kept (capture, logits, mixing, lens: one entry each)
CACHE_SIZE = 16


@dataclass
class Session:
    """A language model, its text path and the server's limits.

    Args:
        model: an :class:`attnlab.GPT` (eval mode is set).
        io: its text path (:class:`~attnlab.tasks.lm.LMIO`).
        title: shown on the page.
        max_tokens: the longest sequence a request may run (at most the model's context).
    """

    model: nn.Module
    io: LMIO
    title: str = "attnlab"
    max_tokens: int = DEFAULT_MAX_TOKENS

    def __post_init__(self) -> None:
        self.model.eval()
        self.max_tokens = min(self.max_tokens, self.context)
        self.lock = threading.RLock()  # re-entered by a cached result computed from another
        self.layers = list(attention_modules(self.model))
        self._cache: OrderedDict[Hashable, Any] = OrderedDict()
        self._model_facts: dict[Hashable, Any] = {}

    @property
    def context(self) -> int:
        """The longest sequence the model takes (its positions)."""
        return int(self.io.n_positions)

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size."""
        cfg = self.model.config
        return int(cfg.vocab_size) if isinstance(cfg, GPTConfig) else 0

    @contextmanager
    def running(self) -> Iterator[None]:
        """Hold the model: one request at a time runs it."""
        with self.lock, torch.no_grad():
            yield

    def remember(self, key: tuple[Hashable, ...], compute: Callable[[], T]) -> T:
        """``compute()``, run once per ``key`` while the model is held, then kept.

        A key of one element (``("roles",)``) names what depends on the model alone: kept for the
        session's life. A longer one (``("capture", ids)``) depends on a text's tokens: the
        :data:`CACHE_SIZE` latest are kept.

        Args:
            key: what the result depends on, besides the model.
            compute: makes it.

        Returns:
            The result.
        """
        with self.running():
            if len(key) == 1:
                if key not in self._model_facts:
                    self._model_facts[key] = compute()
                return self._model_facts[key]  # type: ignore[no-any-return]
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]  # type: ignore[no-any-return]
            value = compute()
            self._store(key, value)
            return value

    def _store(self, key: Hashable, value: Any) -> None:
        """Keep ``value`` under ``key`` (replacing one kept before), the latest
        :data:`CACHE_SIZE`."""
        with self.lock:
            self._cache[key] = value
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)

    def captured(self, ids: Sequence[int]) -> ActivationCache:
        """The attention of every layer on ``ids`` (``attnlab view``'s capture), cached; the
        same forward's last logits are kept too, so the next-token bars of the text run nothing
        again.

        Args:
            ids: the tokens.

        Returns:
            The :class:`~attnlab.inspect.ActivationCache`.
        """
        inputs = self.inputs(ids)

        def run() -> ActivationCache:
            kept: dict[str, torch.Tensor] = {}

            def keep(_m: nn.Module, _a: Any, out: Any) -> None:
                kept["logits"] = out.logits[:, -1]

            handle = self.model.register_forward_hook(keep)
            try:
                cache = capture_inputs(self.model, inputs)
            finally:
                handle.remove()
            if "logits" in kept:
                self._store(("logits", tuple(ids)), kept["logits"])
            return cache

        return self.remember(("capture", tuple(ids)), run)

    def info(self) -> dict[str, Any]:
        """What the page needs to know of the model.

        Returns:
            ``title``, ``layers`` (attention module paths), ``heads`` (per layer),
            ``n_positions``, ``max_tokens``, ``vocab_size``.
        """
        heads = [int(m.num_heads) for m in attention_modules(self.model).values()]
        return {
            "title": self.title,
            "layers": self.layers,
            "heads": heads,
            "n_positions": self.context,
            "max_tokens": self.max_tokens,
            "vocab_size": self.vocab_size,
        }

    # ------------------------------------------------------------------ text → ids
    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (the task's own path), refused past :attr:`max_tokens`.

        Args:
            text: the request's text.

        Returns:
            Its token ids, no special token added.

        Raises:
            FieldError: ``text`` encodes to no token or to more than :attr:`max_tokens`.
        """
        try:
            ids = self.io.encode(text)
        except UnicodeError:
            raise FieldError("text", "text cannot be tokenized (invalid Unicode)") from None
        except FieldError:
            raise
        except ValueError as exc:  # the task's own refusal (no tokens), an ArgumentError
            raise FieldError("text", f"text: {exc}") from None
        self.check_length(ids, "text")
        return ids

    def check_length(self, ids: Sequence[int], field: str, extra: int = 0) -> None:
        """Refuse a sequence (plus ``extra`` tokens to generate) past :attr:`max_tokens`.

        Args:
            ids: the tokens.
            field: the request field named in the refusal.
            extra: tokens still to generate after them.

        Raises:
            FieldError: too long (status 413), naming ``field``.
        """
        if len(ids) + extra > self.max_tokens:
            more = f" and {extra} to generate" if extra else ""
            raise FieldError(
                field,
                f"{field}: {len(ids)} tokens{more} is more than the {self.max_tokens} this server "
                "runs (attnlab serve --max-tokens; the model's context is "
                f"{self.context})",
                413,
            )

    def labels(self, ids: Sequence[int]) -> list[str]:
        """Each token's text, as figures label it.

        Args:
            ids: token ids.

        Returns:
            One label per id (:func:`attnlab.tasks.base.token_labels`).
        """
        return token_labels(self.io.tokenizer, ids)

    def inputs(self, ids: Sequence[int], prompt_length: int | None = None) -> ModelInputs:
        """What the model reads for ``ids``: the first ``prompt_length`` the prompt, the rest
        generated (marked so on the page).

        Args:
            ids: the tokens.
            prompt_length: how many of them are the prompt; ``None``: all.

        Returns:
            The :class:`~attnlab.tasks.base.ModelInputs`.
        """
        n = len(ids) if prompt_length is None else prompt_length
        prompt, new = list(ids[:n]), list(ids[n:])
        return ModelInputs(
            kind="lm",
            source_ids=tuple(prompt),
            target_ids=tuple(new),
            source_tokens=tuple(self.labels(prompt)),
            target_tokens=tuple(self.labels(new)),
            output=self.io.decode(list(ids)),
            token_scores=self.scores_of(ids, n),
        )

    def scores_of(self, ids: Sequence[int], start: int) -> tuple[TokenScore, ...]:
        """The probabilities this server drew the tokens ``ids[start:]`` with, as
        :meth:`generate` recorded them (the viewer's p% labels), or ``()`` when it did not
        generate all of them (typed ids, or forgotten by the bounded cache).

        Args:
            ids: the tokens.
            start: where the generated ones start.

        Returns:
            One :class:`~attnlab.tasks.token_scores.TokenScore` per generated token, or ``()``.
        """
        with self.lock:
            kept = self._cache.get(("scores", tuple(ids)))
        if kept is None or start >= len(ids):
            return ()
        tail = tuple(s for s in kept if s.position >= start)
        return tail if [s.position for s in tail] == list(range(start, len(ids))) else ()

    # ------------------------------------------------------------------ attention
    def viewer(
        self,
        ids: Sequence[int],
        prompt_length: int | None = None,
        keep: tuple[int, int] | None = None,
    ) -> ViewerData:
        """The viewer's data for ``ids``: every layer's captured weights (``attnlab view``'s).

        Args:
            ids: the tokens.
            prompt_length: where the generated tokens start, or ``None`` (none generated).
            keep: ``(layer, head)`` the page had chosen, kept if it exists; ``None``: the page
                opens on the most informative head.

        Returns:
            The :class:`~attnlab.viz.viewer.ViewerData` (title: the server's).

        Raises:
            FieldError: the page would pass :data:`MAX_PAGE_BYTES` (status 413).
        """
        heads = sum(int(m.num_heads) for m in attention_modules(self.model).values())
        page = heads * len(ids) ** 2 * 16 // 3
        if page > MAX_PAGE_BYTES:
            longest = math.isqrt(MAX_PAGE_BYTES * 3 // (16 * heads))
            raise FieldError(
                "text",
                f"text: {len(ids)} tokens make a page of {heads} heads of {len(ids)} × "
                f"{len(ids)} weights, about {format_bytes(page)}, more than the "
                f"{format_bytes(MAX_PAGE_BYTES)} a browser opens; at most {longest} tokens",
                413,
            )
        inputs = self.inputs(ids, prompt_length)
        data = viewer_for(inputs, self.captured(ids), self.title)
        if keep is not None:
            layer, head = keep
            layers = data.groups[0].layers
            if 0 <= layer < len(layers) and 0 <= head < layers[layer].weights.shape[0]:
                start = ViewerStart(0, layer, head, "the head chosen before")
                data = ViewerData(**{**data.__dict__, "start": start})
        return data

    # ------------------------------------------------------------------ step by step
    def steps(
        self, ids: Sequence[int], layer: int, head: int, query: int, *, figure: bool = True
    ) -> dict[str, Any]:
        """One head step by step (the ``plot steps`` panel) and the numbers of one query row.

        Args:
            ids: the tokens.
            layer: index into :attr:`layers`.
            head: the query head.
            query: the query position.
            figure: also draw the seven panels (``plot steps``' figure) as a PNG ``data:`` URL;
                ``False``: only the numbers, from the same resolved call, undrawn.

        Returns:
            ``layer`` (its path), ``head``, ``query``, ``tokens``, ``q`` (the row as scored),
            ``scores`` (``null`` where masked), ``weights``, ``output``, the panel's shapes and
            with a figure its ``title`` and ``image`` (else ``null``).
        """
        name = self.layers[layer]
        tokens = self.labels(ids)
        x = torch.tensor([list(ids)], dtype=torch.long, device=_device(self.model))
        image = title = None
        with self.running():
            if figure:  # the panel of `attnlab plot steps`, drawn (seconds of CPU on a large model)
                plot = step_panel_from_model(
                    self.model, lambda: self.model(x), layer=name, head=head,
                    query_tokens=tokens, key_tokens=tokens,
                )  # fmt: skip
                d = plot.data
            else:  # the same resolved call, not drawn
                d = step_data_from_model(self.model, lambda: self.model(x), layer=name, head=head)
        if figure:
            buf = io.BytesIO()
            plot.figure.savefig(buf, format="png", dpi=72)
            image = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
            title = plot.figure.get_suptitle()
        return {
            "layer": name,
            "head": head,
            "query": query,
            "tokens": tokens,
            "title": title,
            "d_head": int(d["q"].shape[1]),
            "d_model": int(d["x"].shape[1]),
            "q": _floats(d["q"][query]),
            "scores": _floats(d["scores"][query]),
            "weights": _floats(d["weights"][query]),
            "output": _floats(d["output"][query]),
            "visible": [bool(v) for v in d["mask"][query]],
            "image": image,
        }

    # ------------------------------------------------------------------ next token
    def next_token(self, ids: Sequence[int], sampling: Sampling, top: int) -> dict[str, Any]:
        """The next token's distribution under the sampler's numbers.

            π = softmax(filter(z / τ)),    z = model(ids).logits[-1]

        Args:
            ids: the tokens.
            sampling: temperature, top-k, top-p.
            top: how many of the likeliest tokens to list.

        Returns:
            ``tokens``: the ``top`` likeliest ``{id, token, probability}`` (probability under
            ``π``, and ``raw``, under ``softmax(z)``); ``kept``: tokens with non-zero ``π``;
            ``entropy``: of ``π`` in nats.
        """
        x = torch.tensor([list(ids)], dtype=torch.long, device=_device(self.model))
        logits = self.remember(("logits", tuple(ids)), lambda: self.model(x).logits[:, -1])
        return self.ranked(logits, sampling, top)

    def ranked(self, logits: torch.Tensor, sampling: Sampling, top: int) -> dict[str, Any]:
        """The ``top`` likeliest tokens of ``π = softmax(filter(z / τ))`` (see :meth:`next_token`).

        Args:
            logits: ``z``, ``(1, V)``.
            sampling: temperature, top-k, top-p.
            top: how many tokens to list.

        Returns:
            As :meth:`next_token`.

        Shape:
            logits ``(1, V)``.
        """
        probs = self.distribution(logits, sampling)[0].double().cpu()
        raw = logits.double().softmax(-1)[0].cpu()
        order = torch.argsort(probs, descending=True, stable=True)[:top].tolist()
        labels = self.labels(order)
        positive = probs[probs > 0]
        return {
            "tokens": [
                {"id": i, "token": t, "probability": float(probs[i]), "raw": float(raw[i])}
                for i, t in zip(order, labels)
            ],
            "kept": int(positive.numel()),
            "entropy": float(-(positive * positive.log()).sum()),
        }

    @staticmethod
    def distribution(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
        """:func:`~attnlab.decoding.strategies.sampling_distribution` of ``logits``.

        Args:
            logits: ``(N, V)``.
            sampling: temperature, top-k, top-p.

        Returns:
            The probabilities the sampler draws from, zero on the filtered tokens.

        Shape:
            logits ``(N, V)`` → probabilities ``(N, V)``.
        """
        return sampling_distribution(
            logits, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
        )

    # ------------------------------------------------------------------ generation
    def generate(self, ids: Sequence[int], n: int, seed: int, sampling: Sampling) -> list[int]:
        """``ids`` followed by ``n`` sampled tokens, as ``attnlab generate --seed`` draws them
        (:meth:`~attnlab.tasks.lm.LMIO.generate`, strategy ``sample``; stops at the end token).
        Their probabilities are kept with the sequence (:meth:`scores_of`): the viewer labels
        the generated tokens with them, as ``attnlab view --generate`` does.

        Args:
            ids: the tokens so far.
            n: how many to add.
            seed: the sampling generator's seed.
            sampling: temperature, top-k, top-p.

        Returns:
            ``ids`` followed by the new tokens.

        Raises:
            FieldError: ``ids`` and ``n`` together past :attr:`max_tokens`.
        """
        self.check_length(ids, "n", n)
        scores: list[Generation] = []
        with self.running():
            out = self.io.generate(
                self.model, None, max_new_tokens=n, strategy="sample", seed=seed,
                source_ids=list(ids), temperature=sampling.temperature, top_k=sampling.top_k,
                top_p=sampling.top_p, scores=scores,
            )  # fmt: skip
            # the drawn tokens' probabilities, after those of the tokens drawn before them
            before = self._cache.get(("scores", tuple(ids)), ())
            new = token_scores(self.io.tokenizer, scores[0]) if scores else []
            # (replacing any kept: the same tokens drawn again under other numbers)
            self._store(("scores", tuple(out)), (*before, *new))
        return out


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _floats(a: np.ndarray) -> list[float | None]:
    """JSON numbers; a masked score (``-inf``) or any non-finite value becomes ``null``."""
    return [float(v) if math.isfinite(v) else None for v in a.tolist()]
