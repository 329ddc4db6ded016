"""``attnlab.generate``: autoregressive decoding for both model families.

Decoding factorises the output distribution left to right,

    p(y | x) = Π_t p(y_t | x, y_{<t}),

and picks ``y_t`` one token at a time: the most likely one (greedy), a draw from the (filtered)
distribution (sampling), or the continuation of the ``K`` best partial outputs (beam search). A
preallocated KV cache (:mod:`attnlab.nn.kv_cache`) keeps the keys and values of past positions,
so each step processes only the new token.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, Literal, overload

import torch

from attnlab._budget import check_fits
from attnlab._checks import (
    check_choice,
    check_finite_weights,
    check_positive_int,
    check_tensor,
    shape_str,
)
from attnlab.decoding.beam import BeamResult, beam_search
from attnlab.decoding.compiled import CompiledStepper, static_unsupported
from attnlab.decoding.layout import lay_out_for_decoding
from attnlab.decoding.scores import Generation, StepScores, stack_steps, step_scores
from attnlab.decoding.steppers import CausalStepper, Seq2SeqStepper, Stepper
from attnlab.decoding.strategies import draw, greedy_choice, sampling_distribution
from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = ["STRATEGIES", "Generation", "generate"]

logger = logging.getLogger(__name__)

STRATEGIES = ("greedy", "sample", "beam")


@overload
def generate(
    model: Any, input_ids: torch.Tensor, *, return_scores: Literal[False] = ..., **kwargs: Any
) -> torch.Tensor: ...


@overload
def generate(
    model: Any, input_ids: torch.Tensor, *, return_scores: Literal[True], **kwargs: Any
) -> Generation: ...


# the overloads give the result's type from return_scores; the options are the implementation's
@torch.no_grad()  # type: ignore[misc]
def generate(
    model: Any,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    strategy: str = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    num_beams: int = 4,
    length_penalty: float = 1.0,
    early_stopping: bool = True,
    eos_token_id: int | Sequence[int] | None = None,
    attention_mask: torch.Tensor | None = None,
    pad_token_id: int | None = None,
    compile: bool = False,
    cache_sinks: int | None = None,
    cache_window: int | None = None,
    return_scores: bool = False,
    num_alternatives: int = 5,
) -> torch.Tensor | Generation:
    """Generate tokens with a KV cache, from a decoder-only or an encoder-decoder model.

    **Decoder-only** (:class:`attnlab.GPT`): ``input_ids`` is the prompt; the result is the prompt
    followed by the new tokens. Batched prompts of different lengths are left-padded and come with
    an ``attention_mask`` (0 = padding); positions are counted from each row's first real token.

    **Encoder-decoder** (:class:`attnlab.Transformer`, detected by its ``encode`` method):
    ``input_ids`` is the source; it is encoded once and the target is decoded from
    ``config.bos_id``. The result is the target ids, ``<bos>`` first.

    Rows that stop (on a token of ``eos_token_id``) are padded with ``pad_token_id`` afterwards;
    generation ends when every row has stopped or after ``max_new_tokens``. The model is put in
    eval mode for the call (dropout off) and restored afterwards.

    Args:
        model: a GPT-like model (``forward(input_ids, attention_mask, *, cache)``, ``new_cache``,
            ``config.vocab_size``, ``config.n_positions``) or a Transformer-like one (``encode``,
            ``decode``, ``new_cache``, ``config.src_vocab_size``/``tgt_vocab_size``/``max_len``/
            ``pad_id``/``bos_id``/``eos_id``).
        input_ids: ``(B, T)`` integer token ids: the prompt, or the source.
        max_new_tokens: the most tokens to generate (positive).
        strategy: ``"greedy"`` (argmax), ``"sample"`` or ``"beam"``. Default ``"greedy"``.
        temperature: sampling temperature ``τ > 0`` (``"sample"``). Default 1.0.
        top_k: sample among the ``k`` most likely tokens only (``"sample"``). Default ``None``.
        top_p: sample from the nucleus of probability mass ``p`` (``"sample"``). Default ``None``.
        generator: a ``torch.Generator`` for reproducible sampling. Default the global RNG.
        num_beams: beams ``K`` for ``"beam"``. Default 4.
        length_penalty: ``α`` in the beam score ``log p / n^α``. Default 1.0.
        early_stopping: beam search stops a row once it has ``num_beams`` finished hypotheses
            (``True``) or once none of its live ones can win (``False``). Default ``True``.
        eos_token_id: stop token id, or several. Default ``None`` for a decoder-only model (run
            ``max_new_tokens``), ``config.eos_id`` for an encoder-decoder.
        attention_mask: ``(B, T)`` 0/1 (or bool), 1 = real token; zeros only on the left
            (decoder-only) — for an encoder-decoder it marks the real source tokens (default
            ``input_ids != pad_id``).
        pad_token_id: fills rows after they stop. Default ``config.pad_id`` for an encoder-decoder;
            for a decoder-only model the first EOS id, else 0.
        compile: run each step after the prompt as the model's own ``decode_step`` under
            ``torch.compile`` over a static cache (:mod:`attnlab.decoding.compiled`: the KV
            cache at a fixed capacity, the slot held in a tensor; CUDA graphs on CUDA), traced
            once per batch, capacity and dtype and reused by later calls. The same tokens as
            ``False``. A model it does not cover (an encoder-decoder, a kind whose spec does
            not declare ``decodes_statically`` such as Performer or BigBird, a layer with its
            own ``attend_heads``) decodes eagerly, the reason logged. Default ``False``.
        cache_sinks: with ``cache_window``, decode from a sink cache (StreamingLLM, Xiao et al.
            2023; :meth:`attnlab.GPT.new_cache` with ``sinks``): the first ``cache_sinks``
            positions and the last ``cache_window``, positions within the cache, so a
            full-attention decoder generates past ``n_positions``. Decoder-only, no left padding;
            steps run eagerly. Default ``None`` (every position kept).
        cache_window: the recent positions a sink cache keeps (with ``cache_sinks``).
        return_scores: return a :class:`~attnlab.decoding.scores.Generation`: the token ids
            and, for each generated token, its probability under the distribution it was
            chosen from (sampling: ``softmax(filter(z / τ))``, temperature, top-k and top-p
            applied, the very tensor drawn from; greedy and beam: ``softmax(z)``), the
            ``num_alternatives`` most likely tokens under it with their probabilities, its
            entropy (``entropy``: of that processed distribution; ``raw_entropy``: of
            ``softmax(z)``), and for beam search the cumulative log-probabilities and score of
            the returned hypothesis, as the beam ranked it. The tokens are those of
            ``return_scores=False`` (the same draws). Default ``False``: the ids alone.
        num_alternatives: how many alternatives ``return_scores`` lists per token (at most the
            vocabulary). Default 5.

    Returns:
        token ids ``(B, T + n)`` for a decoder-only model, ``(B, 1 + n)`` for an encoder-decoder,
        where ``n <= max_new_tokens`` is the number of steps run; with ``return_scores``, a
        :class:`~attnlab.decoding.scores.Generation` holding them as ``sequences``.

    Raises:
        ValueError: the prompt plus ``max_new_tokens`` would not fit the model's position table
            (the message names the limit), a token id is outside the vocabulary, an argument
            is out of range (the message names it), the KV cache and logits of the
            ``B · num_beams`` rows would exceed the memory of the device (checked before any
            allocation), or the model's weights hold NaN or infinities (the message names the
            first such parameter). TypeError: wrong argument types.

    Shape:
        - input_ids, attention_mask: ``(B, T)``
        - output: ``(B, T + n)`` (decoder-only) or ``(B, 1 + n)`` (encoder-decoder)
        - with ``return_scores``: ``token_probs``, ``entropy``, ``raw_entropy``,
          ``beam_logprobs`` ``(B, n)``; ``top_ids``, ``top_probs`` ``(B, n, num_alternatives)``;
          ``beam_scores`` ``(B,)``

    Examples:
        >>> cfg = al.GPTConfig(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4)
        >>> model = al.GPT(cfg)
        >>> prompt = torch.randint(0, 100, (2, 5))
        >>> al.generate(model, prompt, max_new_tokens=8).shape
        torch.Size([2, 13])
    """
    if not (hasattr(model, "new_cache") and hasattr(model, "config")):
        raise ArgumentTypeError(
            "model must be an attnlab.GPT or attnlab.Transformer (with new_cache and config), "
            f"got {type(model).__name__}"
        )
    seq2seq = hasattr(model, "encode")
    ids = _check_input_ids(input_ids)
    check_positive_int("max_new_tokens", max_new_tokens)
    check_choice("strategy", strategy, STRATEGIES)
    _check_sampling(temperature, top_k, top_p, generator)
    check_positive_int("num_beams", num_beams)
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
        raise ArgumentTypeError(
            f"length_penalty must be a float, got {type(length_penalty).__name__}"
        )
    if not math.isfinite(length_penalty):
        raise ArgumentError(f"length_penalty must be finite, got {length_penalty}")
    if not isinstance(compile, bool):
        raise ArgumentTypeError(f"compile must be a bool, got {type(compile).__name__}")
    if not isinstance(return_scores, bool):
        raise ArgumentTypeError(f"return_scores must be a bool, got {type(return_scores).__name__}")
    check_positive_int("num_alternatives", num_alternatives)
    if not isinstance(early_stopping, bool):
        raise ArgumentTypeError(
            f"early_stopping must be a bool, got {type(early_stopping).__name__}"
        )
    cfg = model.config
    out_vocab = cfg.tgt_vocab_size if seq2seq else cfg.vocab_size
    in_vocab, in_vocab_name = (
        (cfg.src_vocab_size, "src_vocab_size") if seq2seq else (cfg.vocab_size, "vocab_size")
    )
    _check_range(ids, in_vocab, in_vocab_name)
    streaming = cache_sinks is not None or cache_window is not None
    if streaming:
        _check_sink_cache(model, ids, attention_mask, cache_sinks, cache_window, seq2seq)
    else:
        _check_length(cfg, ids.shape[1], max_new_tokens, seq2seq)
    if eos_token_id is None and seq2seq:
        eos_token_id = cfg.eos_id
    eos = _check_token_list("eos_token_id", eos_token_id, out_vocab)
    if pad_token_id is None:
        pad_token_id = cfg.pad_id if seq2seq else (eos[0] if eos else 0)
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int):
        raise ArgumentTypeError(f"pad_token_id must be an int, got {type(pad_token_id).__name__}")
    _check_token_list("pad_token_id", pad_token_id, out_vocab)
    mask = _check_attention_mask(attention_mask, ids, left_padded=not seq2seq)
    if mask is not None and not seq2seq and bool(mask.all()):
        mask = None  # nothing is padded: the plain causal path

    # NaN weights give NaN logits: greedy decoding would return token 0 over and over
    check_finite_weights(model)
    _check_decoding_memory(
        model, ids, max_new_tokens, num_beams if strategy == "beam" else 1, out_vocab, seq2seq
    )
    lay_out_for_decoding(model)  # the weights' strides for fast matrix-vector steps
    was_training = model.training
    model.eval()
    try:
        n_rows = ids.shape[0] * (num_beams if strategy == "beam" else 1)
        expand = num_beams if strategy == "beam" else 1
        sink = (cache_sinks, cache_window) if streaming else None
        stepper = _make_stepper(model, ids, mask, max_new_tokens, expand, seq2seq, compile, sink)
        alternatives = num_alternatives if return_scores else None
        beam_numbers, scores = None, None
        if strategy == "beam":
            result = beam_search(
                stepper,
                batch=ids.shape[0],
                num_beams=num_beams,
                max_new_tokens=max_new_tokens,
                eos_token_ids=eos,
                pad_token_id=pad_token_id,
                length_penalty=float(length_penalty),
                early_stopping=early_stopping,
                alternatives=alternatives,
            )
            longest = max(len(h.tokens) for h in result.best)
            new = torch.full((ids.shape[0], longest), pad_token_id, dtype=torch.long)
            for b, h in enumerate(result.best):
                new[b, : len(h.tokens)] = torch.tensor(h.tokens, dtype=torch.long)
            new = new.to(ids.device)
            if return_scores:
                beam_numbers = _beam_scores(result, new, longest)
        else:
            new, scores = _sequential(
                stepper,
                n_rows,
                max_new_tokens,
                eos,
                pad_token_id,
                sample=strategy == "sample",
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                generator=generator,
                alternatives=alternatives,
            )
    finally:
        model.train(was_training)
    prefix = ids.new_full((ids.shape[0], 1), cfg.bos_id) if seq2seq else ids
    sequences = torch.cat([prefix, new], dim=1)
    if not return_scores:
        return sequences
    numbers = beam_numbers if beam_numbers is not None else scores
    if numbers is None:  # every strategy records its numbers when return_scores is set
        raise RuntimeError("generate: return_scores=True but no scores were recorded")
    return Generation(sequences, **numbers)


def _beam_scores(result: BeamResult, new: torch.Tensor, longest: int) -> dict[str, Any]:
    """:class:`Generation`'s fields for beam search: each hypothesis' trace read against the
    steps' numbers (the row it extended at each step), NaN (``-1`` ids) past its end."""
    steps = result.steps
    batch, k = new.shape[0], steps[0].top_ids.shape[1]
    dtype, device = steps[0].top_probs.dtype, steps[0].top_probs.device
    token_probs = torch.full((batch, longest), math.nan, dtype=dtype, device=device)
    top_ids = torch.full((batch, longest, k), -1, dtype=torch.long, device=device)
    top_probs = torch.full((batch, longest, k), math.nan, dtype=dtype, device=device)
    ent = torch.full((batch, longest), math.nan, dtype=dtype, device=device)
    cumulative = torch.full((batch, longest), math.nan, dtype=torch.float64)
    for b, h in enumerate(result.best):
        for t, (row, logp, cum) in enumerate(h.trace):
            token_probs[b, t] = math.exp(logp)
            top_ids[b, t], top_probs[b, t] = steps[t].top_ids[row], steps[t].top_probs[row]
            ent[b, t] = steps[t].entropy[row]
            cumulative[b, t] = cum
    return {
        "token_probs": token_probs, "top_ids": top_ids, "top_probs": top_probs,
        "entropy": ent, "raw_entropy": ent.clone(),
        "beam_logprobs": cumulative.to(device),
        "beam_scores": torch.tensor([h.score for h in result.best], dtype=torch.float64),
    }  # fmt: skip


def _sequential(
    stepper: Stepper,
    n_rows: int,
    max_new_tokens: int,
    eos: list[int],
    pad_token_id: int,
    *,
    sample: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
    alternatives: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """Greedy or sampled decoding: one token per row per step. Returns ``(N, n)`` tokens and,
    when ``alternatives`` is set, each step's scores (:func:`~attnlab.decoding.scores.stack_steps`)."""
    logits = stepper.prefill()  # (N, V)
    device = logits.device
    eos_t = torch.tensor(eos, dtype=torch.long, device=device)
    finished = torch.zeros(n_rows, dtype=torch.bool, device=device)
    tokens: list[torch.Tensor] = []
    steps: list[StepScores] = []
    stopped: list[torch.Tensor] = []
    filtered = temperature != 1.0 or top_k is not None or top_p is not None
    for step in range(max_new_tokens):
        if sample:  # π = softmax(filter(z / τ)), the tensor the token is drawn from
            probs = sampling_distribution(logits, temperature=temperature, top_k=top_k, top_p=top_p)
            nxt = draw(probs, generator)
            raw = sampling_distribution(logits) if filtered and alternatives else None
        else:
            nxt = greedy_choice(logits)
            probs = sampling_distribution(logits) if alternatives else logits
            raw = None
        if alternatives:
            steps.append(step_scores(probs, nxt, alternatives, raw))
            stopped.append(finished.clone())
        if eos:
            nxt = nxt.masked_fill(finished, pad_token_id)
            finished |= torch.isin(nxt, eos_t)
        tokens.append(nxt)
        if step == max_new_tokens - 1 or (eos and bool(finished.all())):
            break
        logits = stepper.step(nxt)
    scores = stack_steps(steps, torch.stack(stopped, dim=1)) if alternatives else None
    return torch.stack(tokens, dim=1), scores


def _make_stepper(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor | None,
    max_new_tokens: int,
    expand: int,
    seq2seq: bool,
    compile: bool = False,
    sink: tuple[int | None, int | None] | None = None,
) -> Stepper:
    if expand > 1:  # beam search: row b·K + k is beam k of prompt b
        ids = ids.repeat_interleave(expand, dim=0)
        mask = None if mask is None else mask.repeat_interleave(expand, dim=0)
    if seq2seq:
        return Seq2SeqStepper(model, ids, mask, 1 + max_new_tokens)
    if sink is not None:  # a sink cache: eager steps
        sinks, window = sink
        cache = model.new_cache(ids.shape[0], ids.shape[1] + max_new_tokens, device=ids.device,
                                sinks=sinks, window=window)  # fmt: skip
        return CausalStepper(model, ids, mask, ids.shape[1] + max_new_tokens, cache=cache)
    if compile:
        reason = static_unsupported(model)
        if reason is None:
            return CompiledStepper(model, ids, mask, ids.shape[1] + max_new_tokens)
        logger.info("generate(compile=True) decodes eagerly: %s", reason)
    return CausalStepper(model, ids, mask, ids.shape[1] + max_new_tokens)


# -- argument checks --


def _check_decoding_memory(
    model: Any, ids: torch.Tensor, max_new_tokens: int, beams: int, vocab: int, seq2seq: bool
) -> None:
    """Refuse a call whose KV cache and logits exceed the memory of the input's device.

    Per decoded row (``B · num_beams`` rows): the cache the model makes (its layers' own, sized
    on the ``meta`` device, nothing allocated), the prompt's logits ``T · V`` (a decoder-only
    model's forward scores every prompt position) and a step's logits, their log-softmax and
    the beam scores ``3 · V``, in float32.
    """
    rows, t = ids.shape[0] * beams, ids.shape[1]
    # the parameters' dtype (autocast's would be narrower: this counts at most twice too much)
    where = {"device": torch.device("meta"), "dtype": next(model.parameters()).dtype}
    if seq2seq:
        cache = model.new_cache(1, 1 + max_new_tokens, src_len=t, **where)
    else:
        cache = model.new_cache(1, t + max_new_tokens, **where)
    prompt = 1 if seq2seq else t
    needed = rows * (cache.nbytes() + 4 * vocab * (prompt + 3))
    option = f"num_beams {beams}" if beams > 1 else f"a batch of {rows} rows"
    check_fits(
        option,
        needed,
        what=f"the KV cache and logits of {rows} decoded rows",
        device=ids.device,
    )


def _check_input_ids(input_ids: object) -> torch.Tensor:
    ids = check_tensor("input_ids", input_ids)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ArgumentTypeError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
    if ids.dim() != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ArgumentError(
            f"input_ids must have shape (B, T) with B, T >= 1, got {shape_str(ids.shape)}"
        )
    return ids.long()


def _check_range(ids: torch.Tensor, vocab: int, name: str) -> None:
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        bad = hi if hi >= vocab else lo
        raise ArgumentError(f"input_ids must lie in [0, {name} = {vocab}), got token id {bad}")


def _check_sink_cache(
    model: Any,
    ids: torch.Tensor,
    attention_mask: object,
    sinks: int | None,
    window: int | None,
    seq2seq: bool,
) -> None:
    """A sink cache: a decoder-only model, no padding, the prompt and ``sinks + window + 1``
    places within the position table."""
    if seq2seq:
        raise ArgumentError("cache_sinks/cache_window are for decoder-only models")
    if sinks is None or window is None:
        raise ArgumentError(
            f"a sink cache needs both cache_sinks and cache_window, got {sinks!r} and {window!r}"
        )
    if isinstance(sinks, bool) or not isinstance(sinks, int):
        raise ArgumentTypeError(f"cache_sinks must be an int, got {type(sinks).__name__}")
    if sinks < 0:
        raise ArgumentError(f"cache_sinks must be a non-negative int, got {sinks}")
    check_positive_int("cache_window", window)
    if attention_mask is not None:
        raise ArgumentError("attention_mask must be None with a sink cache (no left padding)")
    limit = model.config.n_positions
    longest = max(ids.shape[1], sinks + window + 1)
    if longest > limit:
        raise ArgumentError(
            f"the prompt ({ids.shape[1]} tokens) and cache_sinks + cache_window + 1 = "
            f"{sinks + window + 1} places must fit the position table n_positions = {limit}"
        )


def _check_length(cfg: Any, t: int, max_new_tokens: int, seq2seq: bool) -> None:
    if seq2seq:
        limit = cfg.max_len
        if t > limit:
            raise ArgumentError(
                f"input_ids has {t} source tokens, longer than the model's position table "
                f"max_len = {limit}"
            )
        if 1 + max_new_tokens > limit:
            raise ArgumentError(
                f"<bos> + max_new_tokens = {1 + max_new_tokens} target positions exceed the model's "
                f"position table max_len = {limit}; lower max_new_tokens to at most {limit - 1}"
            )
        return
    limit = cfg.n_positions
    if t + max_new_tokens > limit:
        raise ArgumentError(
            f"input_ids length {t} + max_new_tokens {max_new_tokens} = {t + max_new_tokens} "
            f"positions exceed the model's position table n_positions = {limit}"
        )


def _check_sampling(temperature: object, top_k: object, top_p: object, generator: object) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ArgumentTypeError(f"temperature must be a float, got {type(temperature).__name__}")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ArgumentError(f"temperature must be > 0 and finite, got {temperature}")
    if top_k is not None:
        check_positive_int("top_k", top_k)
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
            raise ArgumentTypeError(f"top_p must be a float in (0, 1], got {type(top_p).__name__}")
        if not 0.0 < float(top_p) <= 1.0:
            raise ArgumentError(f"top_p must be in (0, 1], got {top_p}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ArgumentTypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}"
        )


def _check_token_list(name: str, value: object, vocab: int) -> list[int]:
    if value is None:
        return []
    items: list[int] = []
    for v in list(value) if isinstance(value, (list, tuple)) else [value]:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ArgumentTypeError(f"{name} must be an int or a list of ints, got {value!r}")
        if not 0 <= v < vocab:
            raise ArgumentError(f"{name} must lie in [0, vocab_size = {vocab}), got {v}")
        items.append(v)
    return items


def _check_attention_mask(
    mask: object, ids: torch.Tensor, *, left_padded: bool
) -> torch.Tensor | None:
    if mask is None:
        return None
    m = check_tensor("attention_mask", mask)
    if m.shape != ids.shape:
        raise ArgumentError(
            f"attention_mask must have the shape of input_ids {shape_str(ids.shape)}, "
            f"got {shape_str(m.shape)}"
        )
    if m.is_floating_point() or m.is_complex():
        raise ArgumentTypeError(f"attention_mask must be 0/1 integers or bool, got dtype {m.dtype}")
    if m.dtype != torch.bool and bool(((m != 0) & (m != 1)).any()):
        raise ArgumentError("attention_mask must hold only 0 and 1")
    m = m.long()
    if not bool(m.any(dim=1).all()):
        raise ArgumentError("attention_mask has a row with no real token (all zeros)")
    if left_padded and bool((m[:, 1:] < m[:, :-1]).any()):
        raise ArgumentError(
            "attention_mask must be left-padded (zeros only before the first 1 of each row) for a "
            "decoder-only model; got a 0 after a 1"
        )
    return m
