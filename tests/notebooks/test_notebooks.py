"""The learning path: every notebook executes at its small size (``FULL = False``).

Each run writes the executed notebook to ``build/notebooks/`` (what ``make docs`` renders; it reuses
an output whose key — source, size, library code — still matches). A failing cell fails the test
with the cell and its traceback.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("notebook_runner", REPO / "notebooks" / "run.py")
assert _spec is not None and _spec.loader is not None
runner = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = runner  # its dataclasses look their module up there
_spec.loader.exec_module(runner)

SOURCES = runner.sources()


def _outputs(nb: nbformat.NotebookNode, mime: str) -> list[str]:
    return [
        o["data"][mime]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if mime in o.get("data", {})
    ]


def _printed(nb: nbformat.NotebookNode) -> str:
    return "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "stream"
    )


def _stderr(nb: nbformat.NotebookNode) -> str:
    return "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "stream" and o.get("name") == "stderr"
    )


def test_no_cell_shows_the_generator_that_manual_seed_returns():
    """``torch.manual_seed(0)`` as a cell's last line printed ``Out: <torch._C.Generator …>`` on
    the pages of notebooks 01, 02, 03, 05, 10 and 14."""
    import ast

    import jupytext

    shown = []
    for source in SOURCES:
        for cell in jupytext.read(source).cells:
            if cell.cell_type != "code":
                continue
            body = ast.parse(cell.source).body
            last = body[-1] if body else None
            if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
                func = last.value.func
                if isinstance(func, ast.Attribute) and func.attr == "manual_seed":
                    shown.append(f"{source.name}: {ast.unparse(last)}")
    assert shown == []


def test_the_learning_path_is_complete():
    names = [s.stem for s in SOURCES]
    assert len(names) >= 8, names
    assert [n[:2] for n in names] == [f"{i:02d}" for i in range(1, len(names) + 1)], names


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_notebook_executes(source: Path):
    run = runner.execute(source, force=True, threads=1)
    nb = run.notebook
    assert nb.metadata["attnlab"]["full"] is False
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []
    assert _outputs(nb, "image/png"), f"{source.name} shows no figure"
    assert not [t for t in _outputs(nb, "text/plain") if "torch._C.Generator" in t]
    if source.stem.startswith("02"):  # view after transpose, the lookup table, the bottleneck
        text = _printed(nb)
        assert "RuntimeError: view size is not compatible" in text
        assert "max |E(ids) − one_hot(ids) @ E.weight| = 0.0e+00" in text
        assert "56 ordered pairs: one head hands on 28 distinct outputs, two heads 56" in text
    if source.stem.startswith("04"):  # transformers' warnings and progress bars, silenced
        assert _stderr(nb) == "", _stderr(nb)[:300]
    if source.stem.startswith("07"):
        viewers = [h for h in _outputs(nb, "text/html") if 'class="attnlab-viewer"' in h]
        assert viewers, "notebook 07 must show the viewer inline"
        assert "srcdoc=" in viewers[0] and "attnlabViewer" in viewers[0]
    if source.stem.startswith("09"):  # the induction heads carry the in-context copying
        line = re.search(
            r"gap closed: top-\d+ induction ([-\d.]+), random ([-\d.]+) \(max ([-\d.]+)\)",
            _printed(nb),
        )
        assert line, "notebook 09 must print the gap closed by each ablation"
        top, random_mean, random_max = map(float, line.groups())
        assert top > 0.5 and top > random_max and random_mean < 0.25, line.group(0)
    if source.stem.startswith("10"):
        _check_induction_heads_formed(nb)

    if source.stem.startswith("11"):  # the streaming summary: (a) window ≫ (b) sinks ≈ (c)
        found = re.search(
            r"summary: window ([\d.]+), sinks ([\d.]+), recompute ([\d.]+)", _printed(nb)
        )
        assert found, "notebook 11 must print its summary line"
        window, sinks, recompute = map(float, found.groups())
        assert window > 3 * sinks and 0.5 < sinks / recompute < 1.5, found.group(0)
    if source.stem.startswith("13"):
        _check_alibi_extrapolates(nb)
    if source.stem.startswith("15"):  # two processes train with one process's losses
        found = re.search(
            r"two processes vs one: tensor-parallel max \|Δloss\| ([-+\d.e]+), "
            r"context-parallel ([-+\d.e]+)",
            _printed(nb),
        )
        assert found, "notebook 15 must print its summary line"
        tensor, context = map(float, found.groups())
        assert 0 <= tensor < 1e-4 and 0 <= context < 1e-4, found.group(0)
    if source.stem.startswith("14"):
        _check_efficient_attention(nb)
    if source.stem.startswith("16"):
        _check_low_rank_relations(nb)
    if source.stem.startswith("17"):
        _check_attention_flow(nb)
    if source.stem.startswith("18"):
        _check_sinks_say_little(nb)
    if source.stem.startswith("20"):
        _check_lenses(nb)


def _check_attention_flow(nb: nbformat.NotebookNode) -> None:
    """Notebook 17 (Abnar & Zuidema's Table 1): the agreement model learnt its task, and rollout
    and flow agree with blank-out better than the last layer's raw attention (small run: raw
    −0.01, rollout 0.30, flow 0.35 over 16 sentences, accuracy 1.000; against integrated
    gradients −0.04, 0.06, 0.10: not asserted, the margin is within the spread)."""
    m = re.search(
        r"spearman with blank-out: raw ([-\d.]+), rollout ([-\d.]+), flow ([-\d.]+); "
        r"with integrated gradients: raw ([-\d.]+), rollout ([-\d.]+), flow ([-\d.]+) "
        r"\((\d+) sentences, accuracy ([\d.]+)\)",
        _printed(nb),
    )
    assert m, "notebook 17 must print 'spearman with blank-out: raw X, rollout Y, flow Z; ...'"
    raw, roll, flow, *gradients = (float(v) for v in m.groups()[:6])
    sentences, accuracy = int(m[7]), float(m[8])
    assert sentences >= 10 and accuracy > 0.9, m.group(0)  # chance is 0.5
    assert all(-1 <= v <= 1 for v in (raw, roll, flow, *gradients)), m.group(0)
    assert min(roll, flow) > raw + 0.1, m.group(0)


def _check_low_rank_relations(nb: nbformat.NotebookNode) -> None:
    """Notebook 16: no head's QK circuit exceeds rank d_head, and weight ≠ importance is measured."""
    text = _printed(nb)
    rank = re.search(r"numerical rank of M_QK: min (\d+), max (\d+) \(bound d_head = (\d+)\)", text)
    assert rank, "notebook 16 must print the numerical ranks of M_QK"
    low, high, d_head = map(int, rank.groups())
    assert 1 <= low <= high <= d_head, rank.group(0)
    m = re.search(
        r"weight vs ablation effect: spearman ([-\d.]+) over (\d+) \(head, key\) pairs; "
        r"([-\d.]+) over the (\d+) with weight >= 0.1",
        text,
    )
    assert m, "notebook 16 must print 'weight vs ablation effect: spearman X over N ...'"
    rho_all, n_all, rho_heavy, n_heavy = float(m[1]), int(m[2]), float(m[3]), int(m[4])
    assert n_all > n_heavy >= 10 and -1 <= rho_heavy <= 1 and -1 <= rho_all <= 1, m.group(0)
    # the claim the notebook makes: among the keys that get weight, the order falls apart
    assert rho_heavy < rho_all - 0.2, m.group(0)


def _check_lenses(nb: nbformat.NotebookNode) -> None:
    """Notebook 20: through the logit lens " Paris" is SmolLM2's top token only at the output
    (row 30 of 31, at both sizes), and the line comparing the lenses is printed."""
    m = re.search(
        r"' Paris' first top-1: logit lens row (\d+), tuned lens row (\w+) \(of (\d+)\); "
        r"tuned KL at or below logit KL at (\d+) of (\d+) rows",
        _printed(nb),
    )
    assert m, "notebook 20 must print \"' Paris' first top-1: logit lens row N, ...\""
    first, rows, below, compared = int(m[1]), int(m[3]), int(m[4]), int(m[5])
    assert rows == 31 and first == rows - 1 and compared == rows - 1, m.group(0)
    assert 0 <= below <= compared, m.group(0)


def _check_sinks_say_little(nb: nbformat.NotebookNode) -> None:
    """Notebook 18: in layers 12–29 the first token takes a large share of the weight and a far
    smaller share of what is moved, its value vectors being short (32 tokens: weights 0.581,
    norm 0.239, norm_residual 0.060, alti 0.005; value norm 0.25 of the others')."""
    text = _printed(nb)
    m = re.search(
        r"first-token share, layers 12–29: weights ([\d.]+), norm ([\d.]+), "
        r"norm_residual ([\d.]+), alti ([\d.]+)",
        text,
    )
    assert m, "notebook 18 must print 'first-token share, layers 12–29: weights X, norm Y, ...'"
    weights, norm, residual, alti = map(float, m.groups())
    assert weights > 0.3 and weights > 2 * norm and norm > residual > alti, m.group(0)
    v = re.search(r"value norms, layers 12–29: first token ([\d.]+), others ([\d.]+)", text)
    assert v, "notebook 18 must print the value norms of the first token and the others"
    assert float(v[1]) < 0.5 * float(v[2]), v.group(0)


def _check_induction_heads_formed(nb: nbformat.NotebookNode) -> None:
    """Notebook 10's last line: the 2-layer model formed an induction head, the 1-layer did not."""
    text = _printed(nb)
    m = re.search(r"induction score: 2-layer ([\d.]+) \(step 0: ([\d.]+)\), 1-layer ([\d.]+)", text)
    assert m, "notebook 10 must print 'induction score: 2-layer X (step 0: Y), 1-layer Z'"
    end2, start2, end1 = (float(v) for v in m.groups())
    assert start2 < 0.1, f"2-layer induction score at step 0: {start2}"
    assert end2 > 0.6, f"2-layer model formed no induction head: best layer-1 score {end2}"
    # one layer cannot match a token's predecessor: what it scores is attention to recent tokens
    assert end1 < 0.3 and end2 - end1 > 0.4, f"1-layer control scored {end1} (2-layer {end2})"


def _check_alibi_extrapolates(nb: nbformat.NotebookNode) -> None:
    """Notebook 13's summary: trained at L, ALiBi reads 4L at its loss at L; RoPE and sinusoidal
    positions do worse at 4L than at L (measured ×1.00, ×1.13, ×1.14)."""
    m = re.search(
        r"extrapolation at 4L: alibi ([\d.]+), rope ([\d.]+), sinusoidal ([\d.]+) "
        r"\(loss at L: alibi ([\d.]+), rope ([\d.]+), sinusoidal ([\d.]+)\)",
        _printed(nb),
    )
    assert m, "notebook 13 must print 'extrapolation at 4L: alibi X, rope Y, sinusoidal Z (...)'"
    alibi, rope, sinusoidal, alibi_l, rope_l, sinusoidal_l = (float(v) for v in m.groups())
    assert alibi < 1.02 * alibi_l and alibi < min(rope, sinusoidal), m.group(0)
    assert rope > 1.03 * rope_l and sinusoidal > 1.03 * sinusoidal_l, m.group(0)


def _check_efficient_attention(nb: nbformat.NotebookNode) -> None:
    """Notebook 14's summary: Performer's error falls with m, the window's cost is measured, and
    only the patterns that reach the copied symbols learn to copy them."""
    found = re.search(
        r"performer error: m=(\d+) ([\d.]+), m=(\d+) ([\d.]+); window cost at T=(\d+): "
        r"([\d.]+)x dense.*copy accuracy: sliding ([\d.]+), bigbird ([\d.]+), "
        r"bigbird without global ([\d.]+)",
        _printed(nb),
    )
    assert found, "notebook 14 must print its summary line"
    m_lo, m_hi = int(found.group(1)), int(found.group(3))
    err_lo, err_hi, window = (float(found.group(i)) for i in (2, 4, 6))
    sliding, bigbird, no_global = (float(found.group(i)) for i in (7, 8, 9))
    assert m_hi >= 16 * m_lo and err_hi < err_lo / 2, found.group(0)  # ~1/√m: 1/4 at 16× m
    assert window > 0, found.group(0)
    # the window and BigBird without its global block cannot reach the symbols: chance (1/16)
    assert sliding < 0.2 and no_global < 0.2 and bigbird > 0.8, found.group(0)


def test_switch_is_required_and_turned_on_for_full(tmp_path):
    bad = tmp_path / "01_bad.py"
    bad.write_text("# %%\nSMALL = True\n", encoding="utf-8")
    with pytest.raises(ValueError, match="first code cell must hold the line 'FULL = False'"):
        runner.load(bad, full=False)
    good = tmp_path / "01_good.py"
    good.write_text(
        "# %% [markdown]\n# hi\n\n# %%\nFULL = False  # sizes\nN = 3\n", encoding="utf-8"
    )
    full = runner.load(good, full=True)
    assert full.cells[1].source == "FULL = True  # sizes\nN = 3"
    assert runner.cache_key(good, full=True) != runner.cache_key(good, full=False)


def test_kernels_are_forks_of_one_server_and_share_nothing(tmp_path):
    """Each kernel is a fork of the kernel server (torch imported before the first cell), yet a
    fresh one: what a notebook changes (a module, the environment, the seeds) no other sees."""
    probe = """# %%
FULL = False

# %%
import os
import sys

preloaded = "torch" in sys.modules
import torch

print(preloaded, hasattr(torch, "marked"), os.environ.get("MARKED"), os.getcwd(),
      torch.get_num_threads(), torch.initial_seed(), os.getsid(0) == os.getpid())
torch.marked = os.environ["MARKED"] = "yes"
"""
    for name in ("01_first", "02_second"):
        (tmp_path / f"{name}.py").write_text(probe, encoding="utf-8")
    seen = []
    for name in ("01_first", "02_second"):
        run = runner.execute(
            tmp_path / f"{name}.py", out_dir=tmp_path / "out", force=True, threads=1
        )
        seen.append(_printed(run.notebook).split())
    for words in seen:
        assert words[:5] == ["True", "False", "None", str(runner.HERE), "1"], words
        assert words[6] == "True", words  # a session of its own: its process group is signalled
    assert seen[0][5] != seen[1][5], seen  # torch's seed drawn afresh, as a new interpreter does


def test_progress_bar_in_a_notebook_is_one_html_output_updated_in_place(tmp_path):
    source = tmp_path / "01_progress.py"
    source.write_text(
        """# %%
FULL = False

# %%
from types import SimpleNamespace
from attnlab.training.progress import RichProgress
from attnlab.training.run_types import StepMetrics

bar = RichProgress(description="toy")
bar.on_start(SimpleNamespace(config=SimpleNamespace(steps=40), step=0))
for i in range(1, 41):
    bar.on_step(StepMetrics(step=i, total_steps=40, loss=1 / i, lr=1e-3, grad_norm=1.0,
                            tokens=10, tokens_per_s=1000.0, elapsed=0.1 * i))
bar.on_end(None)
""",
        encoding="utf-8",
    )
    start = time.perf_counter()
    run = runner.execute(source, out_dir=tmp_path / "out", force=True, threads=1)
    assert time.perf_counter() - start < 120
    outputs = run.notebook.cells[1].outputs
    assert [o.output_type for o in outputs] == ["display_data"], outputs
    html = outputs[0]["data"]["text/html"]
    assert "toy" in html and "40/40" in html and "0.0250" in html and html.startswith("<pre")
