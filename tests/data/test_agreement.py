"""The subject–verb agreement grammar: labels, attractors, the held-out split, the batches."""

from __future__ import annotations

import pytest
import torch

from attnlab.data import agreement
from attnlab.data.agreement import (
    VOCABULARY,
    agreement_batch,
    is_heldout,
    sample_agreement,
)
from attnlab.errors import ArgumentError, ArgumentTypeError

_PLURAL = {pl for _, pl in agreement._NOUNS}
_SINGULAR = {sg for sg, _ in agreement._NOUNS}
_VERB_PLURAL = {pl for _, pl in agreement._VERBS}


def _nouns(words):
    return [(i, w) for i, w in enumerate(words) if w in _PLURAL | _SINGULAR]


def test_the_label_is_the_subjects_number_and_attractors_are_the_other_number():
    examples = sample_agreement(400, seed=3, max_modifiers=4)
    assert {e.plural for e in examples} == {False, True}
    assert max(e.attractors for e in examples) >= 3
    for e in examples:
        nouns = _nouns(e.words)
        assert nouns[0][0] == e.subject  # the first noun is the subject's
        assert (e.words[e.subject] in _PLURAL) == e.plural
        assert e.label == VOCABULARY.index("<pl>" if e.plural else "<sg>")
        assert e.attractors == sum((w in _PLURAL) != e.plural for _, w in nouns[1:])
        assert e.words[-1] == "<cls>" and "<cls>" not in e.words[:-1]
        assert len(e.words) <= 5 + 5 * 4
        assert list(e.ids) == [VOCABULARY.index(w) for w in e.words]
        # a relative clause's verb agrees with the clause's own noun, just before it
        for i, w in enumerate(e.words):
            if w in {v for pair in agreement._VERBS for v in pair}:
                noun = next(n for j, n in reversed(nouns) if j < i)
                assert (w in _VERB_PLURAL) == (noun in _PLURAL), e.words


def test_the_split_is_by_hash_and_the_draw_by_seed():
    train = sample_agreement(300, seed=0)
    held = sample_agreement(100, seed=0, heldout=True)
    assert not any(is_heldout(e.words) for e in train)
    assert all(is_heldout(e.words) for e in held)
    assert not {e.words for e in train} & {e.words for e in held}
    assert sample_agreement(50, seed=1) == sample_agreement(50, seed=1)
    assert sample_agreement(50, seed=1) != sample_agreement(50, seed=2)


def test_modifier_counts_bound_the_length():
    short = sample_agreement(100, seed=0, max_modifiers=0)
    assert all(len(e.words) <= 5 and e.attractors == 0 for e in short)
    long = sample_agreement(100, seed=0, min_modifiers=5, max_modifiers=5)
    assert all(len(_nouns(e.words)) == 6 for e in long)  # the subject's and five modifiers'
    assert max(len(e.words) for e in long) <= 30  # within flow's 32


def test_batch_pads_after_cls():
    examples = sample_agreement(5, seed=4, max_modifiers=3)
    ids, cls, labels = agreement_batch(examples)
    assert ids.shape == (5, max(len(e.ids) for e in examples))
    for row, e in enumerate(examples):
        assert int(cls[row]) == len(e.ids) - 1 and VOCABULARY[int(ids[row, cls[row]])] == "<cls>"
        assert ids[row, : len(e.ids)].tolist() == list(e.ids)
        assert (ids[row, len(e.ids) :] == VOCABULARY.index("<pad>")).all()
        assert int(labels[row]) == e.label
    assert labels.dtype == torch.long


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n": -1}, ArgumentError, "n must be >= 0"),
        ({"max_modifiers": 6}, ArgumentError, r"max_modifiers must be in \[0, 5\]"),
        ({"min_modifiers": 4}, ArgumentError, "min_modifiers must be in"),
        ({"heldout_modulus": 1}, ArgumentError, "heldout_modulus must be >= 2"),
        ({"n": 2.0}, ArgumentTypeError, "n must be an int"),
    ],
)
def test_bad_arguments_are_typed_errors(kwargs, error, match):
    args = {"n": 1, "seed": 0} | kwargs
    with pytest.raises(error, match=match):
        sample_agreement(args.pop("n"), **args)
    with pytest.raises(ArgumentError, match="at least one sentence"):
        agreement_batch([])
