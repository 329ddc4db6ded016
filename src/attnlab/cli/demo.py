"""``attnlab demo`` — the main job.

Until the training demo exists it walks through attention for a few token vectors:
x → Q, K, V → scaled scores → weights → output, printed as small tables.
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table

from attnlab.nn.attention import scaled_dot_product_attention


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the main job: a short walk through attention")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def _table(title: str, rows: torch.Tensor, row_names: list[str], col_names: list[str]) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("")
    for c in col_names:
        t.add_column(c, justify="right")
    for name, row in zip(row_names, rows.tolist()):
        t.add_row(name, *(f"{x:.3f}" for x in row))
    return t


def run(args: argparse.Namespace) -> int:
    console = Console()
    gen = torch.Generator().manual_seed(args.seed)
    tokens = ["the", "cat", "sat", "down"]
    d = 4
    x = torch.randn(len(tokens), d, generator=gen)
    w_q, w_k, w_v = (torch.randn(d, d, generator=gen) / d**0.5 for _ in range(3))
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = q @ k.T / d**0.5
    causal = torch.ones(len(tokens), len(tokens), dtype=torch.bool).tril()
    weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    out = weights @ v
    check = scaled_dot_product_attention(q[None, None], k[None, None], v[None, None], is_causal=True)
    dims = [f"d{i}" for i in range(d)]
    console.print(_table("x: token vectors", x, tokens, dims))
    console.print(_table("Q = x W_Q", q, tokens, dims))
    console.print(_table("K = x W_K", k, tokens, dims))
    console.print(_table("scores = Q Kᵀ / √d", scores, tokens, tokens))
    console.print(_table("weights = softmax(scores + causal mask)", weights, tokens, tokens))
    console.print(_table("output = weights · V", out, tokens, dims))
    err = float((check[0, 0] - out).abs().max())
    console.print(f"attnlab.scaled_dot_product_attention agrees: max |difference| = {err:.1e}")
    return 0
