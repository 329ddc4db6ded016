"""``attnlab generate RUN --prompt TEXT``: continue a prompt with a trained language model.

RUN is a run folder of ``attnlab train lm`` (or a checkpoint in it), or a pretrained model: the
bundled ``smollm2-135m``, a ``.gguf`` file, a Hugging Face folder (GPT-2, Llama, Mistral, Qwen2,
GPT-NeoX) or a Hub id (see :func:`attnlab.load_pretrained`). ``--chat TEXT`` puts the text in
the model's chat template as a user's message and prints the assistant's answer (generation stops
at the model's end token). The prompt goes through the task's own text path
(:mod:`attnlab.tasks`); the text is sampled (or greedy / beam decoded) with the KV cache of
:func:`attnlab.generate`; once the continuation passes the model's context length the oldest
tokens are dropped, as nanoGPT's ``sample.py`` does, but a prompt (or a ``--chat`` message in its
template) longer than the context is refused in one line, never cut. For an encoder-decoder run (copy, reverse, sort, translate) the
prompt is the source and the output its decoding (as ``attnlab translate``).

On a terminal, control characters of the text (a model can write escape sequences) are shown
escaped, e.g. ``\\x1b``; ``--raw`` writes them as they are (so does a pipe or a file).

``--show-probs`` lists each generated token with its probability under the distribution it was
drawn from (temperature, top-k and top-p applied; greedy and beam: the softmax of the logits),
the ``--top K`` most likely alternatives and the entropy in nats (and, sampling, the entropy of
the unfiltered softmax; beam search, the beam's cumulative log-probability): a table on a
terminal, tab-separated lines otherwise, and with ``--json`` one JSON object (the text and the
tokens).
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.table import Table

from attnlab._budget import check_at_most
from attnlab.cli import CLIError
from attnlab.cli._device import device
from attnlab.cli._help import plain
from attnlab.cli._terminal import TextConsole, writes_to_terminal
from attnlab.cli.options import add_cache_argument, beams, positive_int, seed
from attnlab.decoding.generate import STRATEGIES
from attnlab.decoding.scores import Generation
from attnlab.tasks.lm import LMIO
from attnlab.tasks.run import load_run
from attnlab.tasks.token_scores import TokenScore, token_scores
from attnlab.tasks.train_options import CAPS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="continue a prompt with a trained language model",
        description=plain(__doc__),
    )
    p.add_argument(
        "run",
        metavar="RUN",
        help="run folder, checkpoint, smollm2-135m, a .gguf file, a Hugging Face folder or Hub id",
    )
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--prompt", help="the text to continue")
    text.add_argument(
        "--chat", metavar="TEXT", help="a user's message, in the model's chat template"
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=200, help="default 200")
    p.add_argument("--strategy", choices=STRATEGIES, default="sample", help="default sample")
    p.add_argument("--temperature", type=float, default=1.0, help="default 1.0")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass")
    p.add_argument("--beams", type=beams, default=4, help="beams for --strategy beam (default 4)")
    p.add_argument("--seed", type=seed, default=0, help="sampling seed (default 0)")
    p.add_argument("--device", type=device, default="cpu", help="default cpu")
    add_cache_argument(p)
    p.add_argument(
        "--show-probs",
        action="store_true",
        help="list each generated token with its probability, alternatives and entropy",
    )
    p.add_argument(
        "--top",
        type=positive_int,
        default=None,
        metavar="K",
        help="alternatives listed per token with --show-probs (default 5)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the text (and --show-probs' tokens) as JSON"
    )
    p.add_argument(
        "--raw",
        action="store_true",
        help="print control characters as they are (default: shown escaped on a terminal)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_at_most("--max-new-tokens", args.max_new_tokens, *CAPS["max_new_tokens"])
    if args.top is not None and not args.show_probs:
        raise CLIError("--top needs --show-probs")
    loaded = load_run(args.run, device=args.device, cache=not args.no_cache)
    console = TextConsole(raw=args.raw)
    if loaded.is_encoder:
        raise CLIError(
            f"{loaded.path} is an encoder: it reads a text in both directions and generates "
            "nothing; use view or inspect (attnlab.embed for sentence embeddings)"
        )
    if not isinstance(loaded.io, LMIO):
        if args.show_probs or args.json:
            raise CLIError("--show-probs and --json are for language models; this run is an "
                           "encoder-decoder")  # fmt: skip
        k = args.beams if args.strategy == "beam" else 1
        for line in loaded.io.translate(loaded.model, [args.prompt], beams=k):  # type: ignore[attr-defined]
            console.print_text(line)
        return 0
    prompt = args.prompt if args.chat is None else _chat_prompt(loaded.io, args.chat)
    scores: list[Generation] | None = [] if args.show_probs else None
    top = 5 if args.top is None else args.top
    ids = loaded.io.generate(
        loaded.model, prompt, max_new_tokens=args.max_new_tokens, strategy=args.strategy,
        seed=args.seed, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        num_beams=args.beams, scores=scores, num_alternatives=top,
    )  # fmt: skip
    if args.chat is not None:  # the assistant's answer only
        ids = ids[len(loaded.io.encode(prompt)) :]
    text = loaded.io.decode(ids)
    tokens = token_scores(loaded.io.tokenizer, scores[0]) if scores else []
    if args.json:
        out: dict[str, object] = {"text": text}
        if args.show_probs:
            out["strategy"] = args.strategy
            out["tokens"] = [t.to_json() for t in tokens]
        sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
        return 0
    console.print_text(text)
    if args.show_probs:
        _print_tokens(console, tokens, args.strategy)
    return 0


def _print_tokens(console: TextConsole, tokens: list[TokenScore], strategy: str) -> None:
    """The tokens as a table on a terminal, else one tab-separated line each (header first)."""
    head = ["position", "token", "probability", "entropy"]
    if strategy == "sample":
        head.append("raw entropy")
    if strategy == "beam":
        head.append("cumulative log p")
    head.append("alternatives")
    rows = []
    for t in tokens:
        row = [str(t.position), json.dumps(t.token, ensure_ascii=False), f"{t.probability:.4f}",
               f"{t.entropy:.3f}"]  # fmt: skip
        if strategy == "sample":
            row.append(f"{t.raw_entropy:.3f}")
        if strategy == "beam":
            row.append(f"{t.cumulative_logprob:.3f}")
        alts = [
            f"{json.dumps(label, ensure_ascii=False)} {p:.4f}" for _, label, p in t.alternatives
        ]
        rows.append([*row, ", ".join(alts)])
    if not writes_to_terminal(console.file):
        for line in [head, *rows]:
            console.print_text("\t".join(line))
        return
    table = Table(*head, title="generated tokens (probability of each under the distribution "
                  "it was chosen from; entropy in nats)")  # fmt: skip
    for row in rows:
        table.add_row(*row)
    console.print(table, markup=False, highlight=False, emoji=False)


def _chat_prompt(io: LMIO, text: str) -> str:
    """The chat template's prompt for one user message, ending where the assistant answers."""
    template = getattr(io.tokenizer, "apply_chat_template", None)
    if template is None or getattr(io.tokenizer, "chat_template", None) is None:
        raise CLIError("--chat needs a model with a chat template; use --prompt")
    return str(template([{"role": "user", "content": text}], add_generation_prompt=True))
