"""Head-role scores (attnlab.inspect.roles): previous-token, duplicate-token, induction, copying.

Every expected value here is known exactly: hand-made weight tensors, and a GPT whose weights are
set by hand so that layer 0 head 0 is a previous-token head, layer 1 head 0 an induction head (it
reads what the previous-token head wrote) and layer 1 head 3 copies its token (identity OV circuit
through the tied embeddings).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.data.tokenizers import BOS, EOS, PAD, UNK, CharTokenizer
from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.inspect import (
    copying_scores,
    head_roles,
    ordinary_token_range,
    repeated_tokens,
    role_scores,
    run_with_cache,
)
from attnlab.models.config import config_to_dict
from attnlab.training.checkpoint import save_checkpoint

# ------------------------------------------------------------------------ hand-made weights


def _shift_pattern(t: int, shift: int) -> torch.Tensor:
    """Weights ``(T, T)`` with all of row ``t`` on key ``t − shift`` (row ``t < shift``: on 0)."""
    w = torch.zeros(t, t, dtype=torch.float64)
    for q in range(t):
        w[q, max(q - shift, 0)] = 1.0
    return w


def test_previous_token_pattern() -> None:
    n = 6
    tokens = repeated_tokens(n, batch=2, token_range=(10, 50), seed=1)
    w = _shift_pattern(2 * n, 1).expand(2, 1, 2 * n, 2 * n)
    s = role_scores(w, tokens)
    assert s["previous"].tolist() == [1.0]
    assert s["induction"].tolist() == [0.0] and s["duplicate"].tolist() == [0.0]


def test_duplicate_and_induction_patterns() -> None:
    n = 5
    tokens = repeated_tokens(n, batch=3, token_range=(0, 20), bos=99, seed=2)
    t = tokens.shape[1]
    # head 0: duplicate (t − n), head 1: induction (t − n + 1), head 2: uniform over the past
    dup, ind = _shift_pattern(t, n), _shift_pattern(t, n - 1)
    uniform = torch.tril(torch.ones(t, t, dtype=torch.float64))
    uniform /= uniform.sum(-1, keepdim=True)
    w = torch.stack([dup, ind, uniform]).expand(3, 3, t, t)
    s = role_scores(w, tokens)
    assert s["duplicate"][:2].tolist() == [1.0, 0.0]
    assert s["induction"][:2].tolist() == [0.0, 1.0]
    # uniform: row t of the second copy (positions n + 1 … 2n after bos) gives 1/(t + 1)
    rows = torch.arange(n + 1, 2 * n + 1, dtype=torch.float64)
    assert s["duplicate"][2].item() == pytest.approx((1 / (rows + 1)).mean().item(), abs=1e-12)
    assert s["previous"][2].item() == pytest.approx(
        (1 / (torch.arange(1, t, dtype=torch.float64) + 1)).mean().item(), abs=1e-12
    )


def test_induction_is_duplicate_shifted_by_one() -> None:
    """On any weights, the induction score equals the duplicate score of the weights shifted one
    key to the left (key s + 1 moved to s) — the definition, checked on random weights."""
    n = 7
    tokens = repeated_tokens(n, batch=2, token_range=(3, 40), seed=3)
    t = tokens.shape[1]
    g = torch.Generator().manual_seed(0)
    w = torch.rand(2, 4, t, t, generator=g, dtype=torch.float64).tril()
    w /= w.sum(-1, keepdim=True)
    shifted = torch.zeros_like(w)
    shifted[..., :-1] = w[..., 1:]
    shifted = shifted.tril(-1)  # an induction target is never the current token
    torch.testing.assert_close(
        role_scores(w, tokens)["induction"], role_scores(shifted, tokens)["duplicate"]
    )


def test_repeated_tokens_are_distinct_seeded_and_in_range() -> None:
    a = repeated_tokens(20, batch=4, token_range=(100, 130), bos=1, seed=5)
    b = repeated_tokens(20, batch=4, token_range=(100, 130), bos=1, seed=5)
    assert a.shape == (4, 41) and torch.equal(a, b)
    assert (a[:, 0] == 1).all() and torch.equal(a[:, 1:21], a[:, 21:])
    assert all(len(set(row[1:21].tolist())) == 20 for row in a)
    assert a[:, 1:].min() >= 100 and a[:, 1:].max() < 130
    wide = repeated_tokens(8, batch=2, token_range=(0, 2**40), seed=0)  # no 2**40 permutation
    assert all(len(set(row[:8].tolist())) == 8 for row in wide)


def test_ordinary_token_range() -> None:
    assert ordinary_token_range(49152, range(17)) == (17, 49152)
    assert ordinary_token_range(50257, [50256]) == (0, 50256)
    assert ordinary_token_range(10, [4]) == (5, 10)
    with pytest.raises(ArgumentError, match="special"):
        ordinary_token_range(2, [0, 1])


# ------------------------------------------------------------------------ a hand-built GPT

V, P, D, HEADS, D_HEAD, BETA = 16, 16, 64, 4, 16, 10.0
POS, TOK, PREV = 0, 16, 32  # the residual's subspaces: position, token, previous token


def _hand_built(num_kv_heads: int = 2, backend: str = "auto") -> attnlab.GPT:
    """Learned one-hot positions and tokens, RMSNorm, no MLP (zero weights), tied embeddings:

    - layer 0 head 0: q = β · (position − 1), k = position → attends to t − 1; its OV writes the
      token it reads into the PREV subspace;
    - layer 1 head 0: q = β · token, k = PREV → attends where the previous token is the current
      token: the token after its earlier occurrence (induction);
    - layer 1 head 3 (key/value group 1): OV = identity on the token subspace (copying);
    - every other head: zero queries/keys (uniform) and zero output.
    """
    cfg = attnlab.GPTConfig(
        vocab_size=V, n_positions=P, n_embd=D, n_layer=2, n_head=HEADS,
        num_kv_heads=num_kv_heads, norm="rmsnorm", bias=False, tie_embeddings=True,
        backend=backend,
    )  # fmt: skip
    model = attnlab.GPT(cfg)
    kv = num_kv_heads * D_HEAD
    eye = torch.eye(D_HEAD)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.transformer.wte.weight[:, TOK : TOK + V] = torch.eye(V)
        assert model.transformer.wpe is not None
        model.transformer.wpe.weight[:, POS : POS + P] = torch.eye(P)
        for block in model.transformer.h:
            block.ln_1.weight.fill_(1.0)
            block.ln_2.weight.fill_(1.0)
        model.transformer.ln_f.weight.fill_(1.0)
        a0, a1 = model.transformer.h[0].attn, model.transformer.h[1].attn
        # layer 0 head 0: q_i = β x_{POS + i + 1}, k_i = x_{POS + i}, v_i = x_{TOK + i}
        a0.c_attn.weight[0 : D_HEAD - 1, POS + 1 : POS + D_HEAD] = BETA * torch.eye(D_HEAD - 1)
        a0.c_attn.weight[D : D + D_HEAD, POS : POS + D_HEAD] = eye
        a0.c_attn.weight[D + kv : D + kv + D_HEAD, TOK : TOK + D_HEAD] = eye
        a0.c_proj.weight[PREV : PREV + D_HEAD, 0:D_HEAD] = eye / 32**0.5  # undo RMSNorm's √32
        # layer 1 head 0: q = β · token, k = previous token (group 0)
        a1.c_attn.weight[0:D_HEAD, TOK : TOK + D_HEAD] = BETA * eye
        a1.c_attn.weight[D : D + D_HEAD, PREV : PREV + D_HEAD] = eye
        # layer 1: value of the last group reads the token; heads 1 and 3 write it back
        last = D + kv + (num_kv_heads - 1) * D_HEAD
        a1.c_attn.weight[last : last + D_HEAD, TOK : TOK + D_HEAD] = eye
        for h in (1, 3):
            a1.c_proj.weight[TOK : TOK + D_HEAD, h * D_HEAD : (h + 1) * D_HEAD] = eye
    return model.eval()


def test_hand_built_previous_token_and_induction_heads() -> None:
    roles = head_roles(_hand_built(), seq_len=6, batch=4, token_range=(1, V), bos=0)
    assert roles.previous[0, 0].item() == pytest.approx(1.0, abs=1e-6)
    assert roles.induction[1, 0].item() == pytest.approx(1.0, abs=1e-6)
    assert roles.previous[0, 0].item() > 0.999 and roles.induction[0, 0].item() < 1e-6
    others = torch.ones(2, HEADS, dtype=torch.bool)
    others[0, 0] = False
    assert roles.previous[others].max() < 0.7  # uniform heads: 1/(t + 1) on t − 1
    others[0, 0], others[1, 0] = True, False
    assert roles.induction[others].max() < 0.2
    assert roles.top("previous", 1)[0][:3] == (0, "transformer.h.0.attn", 0)
    assert roles.top("induction", 1)[0][:3] == (1, "transformer.h.1.attn", 0)
    assert roles.layers == ["transformer.h.0.attn", "transformer.h.1.attn"]


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_copying_score_of_an_identity_ov_circuit_is_one(num_kv_heads: int) -> None:
    """Layer 1 head 3 reads the token through the last key/value group and writes it back through
    the tied embeddings: copying 1. Head 1 (group 0 under GQA, whose value is zero) and every
    other head (zero OV circuit: all logits tie) copy nothing. With two groups a wrong group rule
    (h % H_kv instead of h // (H / H_kv)) would give head 1 the copying value."""
    model = _hand_built(num_kv_heads)
    tokens = torch.arange(1, V)
    expected = torch.zeros(2, HEADS, dtype=torch.float64)
    expected[1, 3] = 1.0  # MHA: head 1 reads group 1 (zero), head 3 group 3
    torch.testing.assert_close(copying_scores(model, tokens, top_k=1), expected)


def _family_configs() -> dict[str, attnlab.GPTConfig]:
    small = {"vocab_size": 64, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4}
    return {
        "gpt2": attnlab.GPTConfig(**small),
        "llama": attnlab.GPTConfig(
            **small, positions="rope", norm="rmsnorm", mlp="gated", activation="silu",
            num_kv_heads=2, bias=False, tie_embeddings=True,
        ),
        "neox": attnlab.GPTConfig(
            **small, positions="rope", rotary_dim=4, parallel_residual=True, activation="gelu",
        ),
    }  # fmt: skip


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_scores_are_equal_on_every_backend(family: str) -> None:
    cfg = _family_configs()[family]
    torch.manual_seed(0)
    reference = attnlab.GPT(dataclasses.replace(cfg, backend="math"))
    with torch.no_grad():  # sharper heads than GPT-2's init, so that the scores differ
        for block in reference.transformer.h:
            block.attn.c_attn.weight.mul_(20.0)
    results = {}
    for backend in ("math", "sdpa", "blockwise"):
        model = attnlab.GPT(dataclasses.replace(cfg, backend=backend))
        model.load_state_dict(reference.state_dict())
        results[backend] = head_roles(model.eval(), seq_len=8, batch=2, token_range=(2, 64))
    for backend in ("sdpa", "blockwise"):
        for name in ("previous", "duplicate", "induction", "copying"):
            torch.testing.assert_close(
                results[backend].score(name), results["math"].score(name), atol=1e-6, rtol=0
            )
    assert results["math"].previous.shape == (2, 4)


def test_mode_is_restored_and_dict_is_json() -> None:
    model = _hand_built().train()
    roles = head_roles(model, seq_len=4, batch=2, token_range=(1, V), bos=0)
    assert model.training
    out = json.loads(json.dumps(roles.to_dict()))
    assert out["scores"]["previous"][0][0] == pytest.approx(1.0, abs=1e-6)
    assert out["top"]["induction"][0] == {
        "layer": 1, "name": "transformer.h.1.attn", "head": 0, "score": pytest.approx(1.0)
    }  # fmt: skip
    assert out["batch"] == 2 and out["token_range"] == [1, V] and out["bos"] == 0


# ------------------------------------------------------------------------ the BOS convention


def test_a_bos_id_is_prepended_and_the_positions_shift() -> None:
    """``bos=ID`` puts ID before the same ``r + r`` (same seed, same range), and the scores are
    those of the prepended ids: every target one position later, computed here directly."""
    model, n, b = _hand_built(), 5, 3
    plain = head_roles(model, seq_len=n, batch=b, token_range=(1, V), seed=3)
    roles = head_roles(model, seq_len=n, batch=b, token_range=(1, V), seed=3, bos=0)
    assert roles.tokens.shape == (b, 2 * n + 1) and (roles.tokens[:, 0] == 0).all()
    assert torch.equal(roles.tokens[:, 1:], plain.tokens)
    _, cache = run_with_cache(model, roles.tokens)
    # with the bos at position 0: r_i at 1 + i and at 1 + n + i
    rows = torch.arange(1, 2 * n + 1)  # every position after the bos has a previous token
    second = torch.arange(n + 1, 2 * n + 1)  # the second copy: duplicate t − n, induction t − n + 1
    for li, name in enumerate(roles.layers):
        a = cache.attentions[name].double()  # (B, H, T, T)
        expected = {
            "previous": a[:, :, rows, rows - 1].mean((0, 2)),
            "duplicate": a[:, :, second, second - n].mean((0, 2)),
            "induction": a[:, :, second, second - n + 1].mean((0, 2)),
        }
        for role, value in expected.items():
            torch.testing.assert_close(roles.score(role)[li], value, atol=1e-12, rtol=0)
    assert not torch.equal(roles.previous, plain.previous)  # the convention changes scores
    assert plain.convention == "no BOS: r + r" and plain.to_dict()["convention"] == "no BOS: r + r"
    assert roles.convention == "BOS id 0 first: [bos] + r + r"
    assert roles.to_dict()["bos"] == 0 and roles.to_dict()["convention"] == roles.convention


@pytest.mark.parametrize(
    ("bos", "error", "message"),
    [
        (True, ArgumentTypeError, "bos must be an int, got bool"),
        ("1", ArgumentTypeError, "bos must be an int, got str"),
        (1.0, ArgumentTypeError, "bos must be an int, got float"),
        (-1, ArgumentError, r"bos must be in \[0, 15\], got -1"),
        (V, ArgumentError, r"bos must be in \[0, 15\], got 16"),
    ],
)
def test_bos_must_be_an_id_of_the_vocabulary(bos: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        head_roles(_hand_built(), seq_len=8, bos=bos)  # type: ignore[arg-type]


def test_cli_roles_bos_convention(
    hand_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["inspect", str(hand_run), "--roles", "--roles-seq-len", "5", "--roles-batch", "2"]
    assert main([*base, "--json"]) == 0  # default: none
    out = json.loads(capsys.readouterr().out)
    assert (out["roles_bos"], out["bos"], out["convention"]) == ("none", None, "no BOS: r + r")
    assert main([*base, "--json", "--roles-bos", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["roles_bos"], out["bos"]) == (3, 3)
    assert out["convention"] == "BOS id 3 first: [bos] + r + r"
    assert main([*base, "--roles-bos", "3"]) == 0
    table = " ".join(capsys.readouterr().out.split())
    assert "BOS id 3 first: [bos] + r + r (--roles-bos 3)" in table
    # tokenizer: the model tokenizer's bos id, a clear error when there is none
    assert main([*base, "--roles-bos", "tokenizer"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--roles-bos tokenizer: " in err and "no tokenizer" in err
    tokenizer = CharTokenizer(list("abcdefghijkl"), [PAD, UNK, BOS, EOS])  # 16 ids, <bos> = 2
    save_checkpoint(tmp_path / "tok", step=1, model=_hand_built(),
                    config={"model": config_to_dict(_hand_built().config)},
                    files={"tokenizer.json": tokenizer.to_json()})  # fmt: skip
    tok = ["inspect", str(tmp_path / "tok"), "--roles", "--roles-seq-len", "5", "--json"]
    assert main([*tok, "--roles-bos", "tokenizer"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["roles_bos"], out["bos"]) == ("tokenizer", tokenizer.bos_id)
    # an id outside the vocabulary, or not an id: one line, exit 2
    assert main([*base, "--roles-bos", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--roles-bos must be a token id in [0, 16), got 16" in err
    for bad in ("x", "-1", "1.5", ""):
        with pytest.raises(SystemExit) as exit_:
            main([*base, f"--roles-bos={bad}"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "expected none, tokenizer or a token id" in err


# ------------------------------------------------------------------------ hostile input


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"seq_len": 8, "bos": 0}, ArgumentError, "n_positions = 16"),
        ({"seq_len": 9}, ArgumentError, "n_positions = 16"),
        ({"seq_len": 0}, ArgumentError, "seq_len"),
        ({"seq_len": 4, "token_range": (5, 200)}, ArgumentError, "vocab_size = 16"),
        ({"seq_len": 6, "token_range": (12, 16)}, ArgumentError, "fewer than the 6"),
        ({"seq_len": 4, "token_range": (3,)}, ArgumentTypeError, "pair of ints"),
        ({"seq_len": 4, "bos": 16}, ArgumentError, "bos"),
        ({"seq_len": 4, "batch": 0}, ArgumentError, "batch"),
        ({"seq_len": 4, "top_k": 0}, ArgumentError, "top_k"),
        ({"seq_len": 2.5}, ArgumentTypeError, "seq_len"),
    ],
)
def test_hostile_arguments_are_refused(options: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        head_roles(_hand_built(), **options)


def test_a_batch_beyond_the_cap_or_the_memory_is_refused_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # issue 32: --roles-batch was unbounded (a batch of 10**6 ran out of memory, or for hours)
    import attnlab._budget
    import attnlab.inspect.roles

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("tokens drawn before the batch was checked")

    monkeypatch.setattr(attnlab.inspect.roles, "repeated_tokens", never)
    with pytest.raises(ArgumentError, match=r"batch must be in \[1, 4096\], got 1000000"):
        head_roles(_hand_built(), seq_len=4, batch=10**6)
    monkeypatch.setattr(attnlab._budget, "_physical_memory", lambda: 10**4)
    with pytest.raises(ArgumentError, match="batch=4096, seq_len=4 needs about"):
        head_roles(_hand_built(), seq_len=4, batch=4096)


def test_role_scores_refuses_bad_shapes() -> None:
    with pytest.raises(ArgumentError, match=r"\(B, H, T, T\)"):
        role_scores(torch.zeros(1, 1, 3, 4), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ArgumentError, match="tokens must be"):
        role_scores(torch.zeros(1, 1, 3, 3), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ArgumentTypeError, match="integer"):
        role_scores(torch.zeros(1, 1, 3, 3), torch.zeros(1, 3))
    with pytest.raises(ArgumentTypeError, match=r"attnlab\.GPT"):
        head_roles(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


# ------------------------------------------------------------------------ command line


@pytest.fixture
def hand_run(tmp_path: Path) -> Path:
    model = _hand_built()
    save_checkpoint(tmp_path / "run", step=1, model=model,
                    config={"model": config_to_dict(model.config)})  # fmt: skip
    return tmp_path / "run"


def test_cli_roles_json_and_table(hand_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(hand_run), "--roles", "--json", "--roles-seq-len", "6"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seq_len"] == 6 and len(out["scores"]["induction"]) == 2
    assert (out["top"]["previous"][0]["layer"], out["top"]["previous"][0]["head"]) == (0, 0)
    assert (out["top"]["induction"][0]["layer"], out["top"]["induction"][0]["head"]) == (1, 0)
    assert out["top"]["previous"][0]["score"] > 0.999
    assert main(["inspect", str(hand_run), "--roles", "--roles-seq-len", "6"]) == 0
    table = capsys.readouterr().out
    assert "induction" in table and "L1 H0" in table and "L0 H0" in table


def test_cli_roles_errors_are_one_line(
    hand_run: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["inspect", str(hand_run), "--roles", "--roles-seq-len", "9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "n_positions = 16" in err
    assert main(["inspect", str(hand_run), "--roles", "--text", "ab"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    assert main(["plot", "roles", "-o", str(tmp_path / "r.png")]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["inspect", str(hand_run), "--roles", "--roles-batch", "5000"]) == 2
    assert "--roles-batch must be at most 4096" in capsys.readouterr().err


def test_cli_plot_roles(hand_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "roles.png"
    assert main(["plot", "roles", "--model", str(hand_run), "-o", str(out),
                 "--roles-seq-len", "6", "--roles-batch", "2"]) == 0  # fmt: skip
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_figure_holds_the_scores() -> None:
    from attnlab.viz import head_roles_figure

    roles = head_roles(_hand_built(), seq_len=5, batch=2, token_range=(1, V), bos=0)
    plot = head_roles_figure(roles)
    for name in ("previous", "duplicate", "induction", "copying"):
        assert (plot.data[name] == roles.score(name).numpy()).all()
    title = plot.figure._suptitle.get_text()  # the convention, whatever the title
    assert title.endswith("\nBOS id 0 first: [bos] + r + r")
    assert head_roles_figure(roles, title="mine").figure._suptitle.get_text().startswith("mine\n")
    with pytest.raises(ArgumentTypeError):
        head_roles_figure(object())  # type: ignore[arg-type]


# ------------------------------------------------------------------------ plot roles --from


def test_from_dict_inverts_to_dict() -> None:
    roles = head_roles(_hand_built(), seq_len=5, batch=2, token_range=(1, V), bos=0)
    roles.copying[0, 1] = float("nan")  # a NaN score travels as null
    data = json.loads(json.dumps(roles.to_dict()))
    again = type(roles).from_dict(data)
    assert again.to_dict() == roles.to_dict()
    assert torch.equal(again.tokens, roles.tokens)
    assert again.copying[0, 1].isnan()


def test_cli_plot_roles_from_file_draws_the_same_figure(
    hand_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import numpy as np

    from attnlab import viz

    drawn = []
    draw = viz.head_roles_figure

    def recorded(roles, **kwargs):  # type: ignore[no-untyped-def]
        plot = draw(roles, **kwargs)
        drawn.append((plot.data, plot.figure._suptitle.get_text()))
        return plot

    monkeypatch.setattr(viz, "head_roles_figure", recorded)
    options = ["--roles-seq-len", "6", "--roles-batch", "2", "--roles-seed", "3"]
    assert main(["inspect", str(hand_run), "--roles", "--json", *options]) == 0
    saved = tmp_path / "roles.json"
    saved.write_text(capsys.readouterr().out)
    assert main(["plot", "roles", "--model", str(hand_run), "-o", str(tmp_path / "a.png"),
                 *options]) == 0  # fmt: skip
    assert main(["plot", "roles", "--from", str(saved), "-o", str(tmp_path / "b.png")]) == 0
    (model_data, model_title), (file_data, file_title) = drawn
    assert model_data.keys() == file_data.keys()
    for name in model_data:
        assert np.array_equal(model_data[name], file_data[name], equal_nan=True), name
    # the same title, naming the model as the file does (inspect names the checkpoint it read)
    assert file_title.split(": ", 1)[1] == model_title.split(": ", 1)[1]
    assert file_title.startswith(str(hand_run))
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "the file does not exist"),
        ("{not json", "not a JSON file"),
        ("[1, 2]", "must be a JSON object, got list"),
        ('{"layers": ["a"]}', "lack 'seq_len'"),
        ("ROWS", "one row per layer"),
        ("STRING", "numbers or null"),
        ("NAN", "finite numbers"),
        ("BATCH", "over 4194304 tokens"),
    ],
)
def test_cli_plot_roles_from_a_bad_file_is_one_line(
    hand_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None,
    message: str,
) -> None:  # fmt: skip
    good = head_roles(_hand_built(), seq_len=4, batch=1).to_dict()
    scores = good["scores"]
    edits = {
        "NAN": {**good, "scores": {**scores, "duplicate": [[float("nan")] * 4] * 2}},
        "ROWS": {**good, "scores": {**scores, "previous": scores["previous"][:1]}},
        "STRING": {**good, "scores": {**scores, "copying": [["x"] * 4] * 2}},
        "BATCH": {**good, "batch": 10**9},
    }
    path = tmp_path / "roles.json"
    if content in edits:
        path.write_text(json.dumps(edits[content]))
    elif content is not None:
        path.write_text(content)
    code = main(["plot", "roles", "--from", str(path), "-o", str(tmp_path / "r.png")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and err.startswith("attnlab: error: ")
    assert str(path) in err and message in err


def test_cli_plot_roles_from_takes_no_model(hand_run: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    path = tmp_path / "roles.json"
    path.write_text(json.dumps(head_roles(_hand_built(), seq_len=4, batch=1).to_dict()))
    out = str(tmp_path / "r.png")
    assert main(["plot", "roles", "--from", str(path), "--model", str(hand_run), "-o", out]) == 2
    assert "takes no --model" in capsys.readouterr().err
    assert main(["plot", "heads", "--from", str(path), "-o", out]) == 2
    assert "--from FILE is for plot roles" in capsys.readouterr().err
