"""``attnlab flops`` — FLOPs, parameters and memory of a model size, term by term.

``attnlab flops --preset gpt2 --seq-len 1024`` prints the forward FLOPs of the Q/K/V projections,
QKᵀ, weights·V, output projection, feed-forward and lm head, the totals for a forward pass and a
training step (≈ 3 × forward), parameters, training memory and the KV cache for multi-head,
grouped-query and multi-query attention. Size options (``--layers``, ``--d-model`` …) override
the preset; ``--json`` prints :meth:`attnlab.inspect.FlopReport.to_dict` instead of tables.

A length must fit the model: ``--seq-len`` (and ``--src-len``) at most its positions, 1024 for
every preset (GPT-2's ``n_positions``, the Transformer's ``max_len``). A longer length is refused
in one line (exit 2), since the model cannot run it; ``--n-positions`` sets a model with a longer
context (for GPT-2 it also adds position-embedding parameters).

``--family llama`` (or ``neox``) gives a GPT preset that family's parts, as ``attnlab train lm
--family`` does (:func:`attnlab.models.families.preset`); ``attnlab flops MODEL`` counts a
trained run's model or a pretrained one (``smollm2-135m``, a ``.gguf`` file, a Hugging Face
folder: its config only, no weights read), any family, the size options applied on top.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnlab.cli import CLIError
from attnlab.cli.options import add_attention_arguments, attention_spec, positive_int
from attnlab.inspect.flops import FlopReport, flops
from attnlab.models.config import GPTConfig, TransformerConfig
from attnlab.models.encoder import EncoderConfig
from attnlab.models.families import PRESETS as FAMILIES
from attnlab.models.families import preset
from attnlab.tasks.run import load_run
from attnlab.tasks.train_options import attention_options

PRESETS: dict[str, GPTConfig | TransformerConfig] = {
    "gpt2": GPTConfig(),
    "gpt2-medium": GPTConfig(n_embd=1024, n_layer=24, n_head=16),
    "gpt2-large": GPTConfig(n_embd=1280, n_layer=36, n_head=20),
    "gpt2-xl": GPTConfig(n_embd=1600, n_layer=48, n_head=25),
    "transformer-base": TransformerConfig(),
    "transformer-big": TransformerConfig(d_model=1024, num_heads=16, d_ff=4096),
}

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

LABELS = {
    "qkv": "Q/K/V projections",
    "q": "Q projection",
    "kv": "K/V projections (source)",
    "scores": "QKᵀ",
    "reduce": "weights · V",
    "proj": "output projection",
    "ffw1": "feed-forward (in)",
    "ffw2": "feed-forward (out)",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "flops",
        help="FLOPs, parameters, memory and KV cache of a model size",
        description="FLOPs of a forward pass and a training step, term by term, with parameters, "
        "training memory and KV-cache bytes for MHA / GQA / MQA. A length longer than the model "
        "holds (--seq-len or --src-len past its positions, 1024 for every preset) is refused: "
        "the model could not run it; --n-positions sets a model with a longer context. "
        "A causal self-attention's QKᵀ and weights · V are counted over the full T × T matrix, "
        "as the math backend computes them and torch's FlopCounterMode counts them; a note "
        "under the table gives the count over the T(T+1)/2 pairs the causal mask keeps.",
    )
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="a run, checkpoint or pretrained model (smollm2-135m, a .gguf file, a Hugging Face "
        "folder): its size instead of --preset's",
    )
    p.add_argument(
        "--preset", choices=sorted(PRESETS), default="gpt2", help="model size (default gpt2)"
    )
    p.add_argument(
        "--family", choices=FAMILIES, default=None,
        help="a GPT preset with this family's parts (as attnlab train lm --family; default gpt2)",
    )  # fmt: skip
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="tokens per sequence, at most the model's positions (default 1024 / 128)",
    )
    p.add_argument(
        "--src-len",
        type=int,
        default=None,
        help="encoder-decoder source length, at most the model's positions",
    )
    p.add_argument(
        "--n-positions",
        type=positive_int,
        default=None,
        help="longest sequence the model holds (GPT n_positions, Transformer max_len; "
        "default the preset's, 1024)",
    )
    p.add_argument("--batch", type=int, default=1, help="sequences per batch (default 1)")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA; 1 = MQA)")
    p.add_argument("--layers", type=int, default=None, help="layers (each of encoder and decoder)")
    p.add_argument("--d-model", type=int, default=None, help="model width")
    p.add_argument("--heads", type=int, default=None, help="query heads")
    p.add_argument("--d-ff", type=int, default=None, help="feed-forward width")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="for the byte counts")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_attention_arguments(
        p,
        what="self-attention (GPT: sliding, performer or bigbird; encoder-decoder: also linformer)",
    )
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> GPTConfig | TransformerConfig:
    """The model's (or the preset's) config with the size options applied."""
    base = PRESETS[args.preset] if args.model is None else _model_config(args.model)
    changes: dict[str, Any] = {}
    if args.family is not None and (args.model is not None or not isinstance(base, GPTConfig)):
        raise CLIError("--family applies to the GPT presets (a MODEL keeps its own family)")
    if isinstance(base, GPTConfig):
        names = {
            "layers": "n_layer", "d_model": "n_embd", "heads": "n_head", "vocab": "vocab_size",
            "n_positions": "n_positions", "d_ff": "d_ff",
        }  # fmt: skip
        if args.family is not None:
            n_embd = base.n_embd if args.d_model is None else args.d_model
            n_head = base.n_head if args.heads is None else args.heads
            changes.update(preset(args.family, n_embd=n_embd, n_head=n_head))
    else:
        names = {
            "d_model": "d_model",
            "heads": "num_heads",
            "d_ff": "d_ff",
            "n_positions": "max_len",
        }
        if args.layers is not None:
            changes["num_encoder_layers"] = changes["num_decoder_layers"] = args.layers
        if args.vocab is not None:
            changes["src_vocab_size"] = changes["tgt_vocab_size"] = args.vocab
    for option, field in names.items():
        value = getattr(args, option)
        if value is not None:
            changes[field] = value
    if args.kv_heads is not None:
        changes["num_kv_heads"] = args.kv_heads
    # a ValueError here (options that do not fit together) is the user's: one line, exit 2
    spec = attention_spec(args)
    if spec is not None:
        changes.update(attention_options(spec, causal_only=isinstance(base, GPTConfig)))
    return dataclasses.replace(base, **changes)


def _model_config(model: str) -> GPTConfig | TransformerConfig:
    """The config of a pretrained model (its metadata only) or of a run's checkpoint."""
    from attnlab.models.pretrained import is_pretrained_source, pretrained_config

    if is_pretrained_source(model):
        return pretrained_config(model)
    config = load_run(model).config
    if isinstance(config, EncoderConfig):  # never: a run folder holds no pretrained encoder
        raise CLIError(f"flops reads decoders and encoder-decoders; {model} is an encoder")
    return config


def _g(x: int) -> str:
    return f"{x / 1e9:,.2f}"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n} B"


def _label(key: str) -> str:
    *part, term = key.split("/")
    name = LABELS.get(term, term.replace("_", " "))
    where = " ".join(p.replace("_", "-") for p in part if p not in ("attention", "mlp"))
    return f"{where}: {name}" if where else name


def _flop_table(report: FlopReport) -> Table:
    t = Table(
        title="FLOPs of one forward pass (matmuls; 1 multiply-add = 2 FLOPs)", title_justify="left"
    )
    t.add_column("term")
    t.add_column("GFLOPs", justify="right")
    t.add_column("share", justify="right")
    total = report.forward_total
    for key, value in report.forward.items():
        t.add_row(_label(key), _g(value), f"{100 * value / total:.1f}%")
    t.add_section()
    t.add_row("[bold]forward[/]", f"[bold]{_g(total)}[/]", "100.0%")
    t.add_row("backward (≈ 2 × forward)", _g(report.backward_total), "")
    t.add_row("[bold]training step (≈ 3 × forward)[/]", f"[bold]{_g(report.train_total)}[/]", "")
    t.add_row("forward per token", f"{report.flops_per_token / 1e9:,.3f}", "")
    return t


def _memory_table(report: FlopReport) -> Table:
    t = Table(title="parameters and memory", title_justify="left")
    t.add_column("item")
    t.add_column("size", justify="right")
    for key, value in report.params.items():
        if key != "total" and value:
            t.add_row(f"params: {key}", f"{value:,}")
    t.add_row("[bold]params: total[/]", f"[bold]{report.params['total']:,}[/]")
    t.add_section()
    labels = {
        "parameters": "parameters", "gradients": "gradients", "adam_state": "AdamW moments (fp32)",
        "training_state": "training state (params + grads + AdamW)", "kv_cache": "KV cache",
        "attention_matrix": "one layer's attention matrix (math backend)",
    }  # fmt: skip
    for key, value in report.memory.items():
        t.add_row(labels.get(key, key), _bytes(value))
    t.add_section()
    for name, value in report.kv_cache.items():
        t.add_row(f"KV cache {name} (H_kv = {report.kv_heads[name]})", _bytes(value))
    return t


def positions(config: GPTConfig | TransformerConfig) -> int:
    """The longest sequence ``config``'s model holds (GPT ``n_positions``, Transformer ``max_len``)."""
    return config.n_positions if isinstance(config, GPTConfig) else config.max_len


def _check_length(
    flag: str, value: int, config: GPTConfig | TransformerConfig, preset: str
) -> None:
    limit = positions(config)
    if value > limit:
        raise CLIError(
            f"{flag} must be at most {limit}, the longest sequence the {preset} model holds, "
            f"got {value} (pass --n-positions {value} for a model with a longer context)"
        )


def run(args: argparse.Namespace) -> int:
    config = build_config(args)
    default = 1024 if isinstance(config, GPTConfig) else 128
    seq_len = args.seq_len if args.seq_len is not None else min(default, positions(config))
    if args.src_len is not None and isinstance(config, GPTConfig):
        raise CLIError("--src-len applies to the encoder-decoder presets (transformer-*)")
    where = args.preset if args.model is None else str(args.model)
    _check_length("--seq-len", seq_len, config, where)
    if args.src_len is not None:
        _check_length("--src-len", args.src_len, config, where)
    report = flops(config, seq_len, args.batch, src_len=args.src_len, dtype=DTYPES[args.dtype])
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
        return 0
    console = Console()
    lengths = f"seq_len {report.seq_len}" + (
        f", src_len {report.src_len}" if report.src_len else ""
    )
    label = config.attention.label()
    pattern = f", {label}" if label else ""
    name = escape(where)
    if isinstance(config, GPTConfig) and config.family != "gpt2":
        name = f"{name} · {config.family}"
    console.print(
        f"[bold]{name}[/] ({report.model}, {lengths}, batch {report.batch}, {args.dtype}{pattern})"
    )
    console.print(_flop_table(report))
    note = _causal_note(config, report)
    if note:
        console.print(note, soft_wrap=False)
    console.print(_memory_table(report))
    return 0


def _causal_note(config: GPTConfig | TransformerConfig, report: FlopReport) -> str | None:
    """What the table counts for a full causal self-attention, and the count over the pairs
    the mask keeps: ``T(T+1)/2`` of the ``T²`` (``None`` for other attention kinds)."""
    if config.attention.label():  # a sparse or linear kind: its own pattern's count already
        return None
    part = "attention" if isinstance(config, GPTConfig) else "decoder/self_attention"
    full = sum(report.forward.get(f"{part}/{term}", 0) for term in ("scores", "reduce"))
    if not full:
        return None
    t = report.seq_len
    causal = full * (t + 1) / (2 * t)
    total = report.forward_total - full + causal
    where = "" if isinstance(config, GPTConfig) else "decoder self-attention: "
    return (
        f"note: {where}QKᵀ and weights · V are counted over the full T × T = {t} × {t} matrix, "
        f"as the math backend computes them (and FlopCounterMode counts them), though the causal "
        f"mask keeps T(T+1)/2 of those pairs: {_g(full)} GFLOPs counted, {_g(int(causal))} over "
        f"the kept pairs (a kernel that skips masked blocks gets near that), forward "
        f"{_g(int(total))} GFLOPs instead of {_g(report.forward_total)}."
    )
