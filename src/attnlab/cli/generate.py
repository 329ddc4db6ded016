"""``attnlab generate RUN --prompt TEXT``: continue a prompt with a trained language model.

RUN is a run folder of ``attnlab train lm`` (or a checkpoint in it, or a Hugging Face GPT-2
folder with a ``tokenizer.json``). The text is sampled (or greedy / beam decoded) with the KV
cache of :func:`attnlab.generate`; past the model's context length the oldest tokens are
dropped, as nanoGPT's ``sample.py`` does. For an encoder-decoder run (copy, reverse, sort,
translate) the prompt is the source and the output its decoding (as ``attnlab translate``).
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console

from attnlab.cli import CLIError
from attnlab.decoding.generate import STRATEGIES, generate
from attnlab.inspect.loading import load_model


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="continue a prompt with a trained language model",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("run", metavar="RUN", help="run folder or checkpoint")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200, help="default 200")
    p.add_argument("--strategy", choices=STRATEGIES, default="sample", help="default sample")
    p.add_argument("--temperature", type=float, default=1.0, help="default 1.0")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass")
    p.add_argument("--beams", type=int, default=4, help="beams for --strategy beam (default 4)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--device", default="cpu", help="default cpu")
    p.set_defaults(func=run)


def generate_text(
    model: torch.nn.Module,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    **kwargs: object,
) -> list[int]:
    """Generate past the context length by sliding the window (oldest tokens dropped).

    Args:
        model: a GPT.
        prompt_ids: the prompt's token ids (at least one).
        max_new_tokens: how many tokens to add.
        **kwargs: passed to :func:`attnlab.generate` (strategy, temperature, generator, …).

    Returns:
        The prompt's ids followed by the new ones.
    """
    n_pos: int = model.config.n_positions  # type: ignore[union-attr,assignment]
    device = next(model.parameters()).device
    if n_pos < 2:
        raise ValueError(
            f"the model's context must hold at least 2 tokens, got n_positions={n_pos}"
        )
    ids = list(prompt_ids)
    remaining = max_new_tokens
    while remaining > 0:
        chunk = min(remaining, max(1, n_pos // 2))
        context = ids[-(n_pos - chunk) :]
        out = generate(
            model,
            torch.tensor([context], dtype=torch.long, device=device),
            max_new_tokens=chunk,
            **kwargs,  # type: ignore[arg-type]
        )
        new = out[0, len(context) :].tolist()
        ids.extend(new)
        remaining -= chunk
        if len(new) < chunk:  # stopped on an end token
            break
    return ids


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be a positive int, got {args.max_new_tokens}")
    loaded = load_model(args.run, device=args.device)
    if loaded.is_seq2seq:
        from attnlab.cli.translate import translate_text

        for line in translate_text(
            loaded, [args.prompt], beams=args.beams if args.strategy == "beam" else 1
        ):
            Console().print(line, markup=False, highlight=False)
        return 0
    tok = loaded.tokenizer
    if tok is None:
        raise CLIError(f"{loaded.path} holds no tokenizer.json: cannot encode the prompt")
    if not args.prompt:
        raise ValueError("--prompt must not be empty")
    prompt_ids = tok.encode(args.prompt)
    if not prompt_ids:
        raise ValueError(f"--prompt {args.prompt!r} encodes to no tokens")
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    kwargs: dict[str, object] = {"strategy": args.strategy}
    if args.strategy == "sample":
        kwargs.update(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=gen
        )
    elif args.strategy == "beam":
        kwargs.update(num_beams=args.beams)
    ids = generate_text(loaded.model, prompt_ids, max_new_tokens=args.max_new_tokens, **kwargs)
    Console().print(tok.decode(ids), markup=False, highlight=False, soft_wrap=True)
    return 0
