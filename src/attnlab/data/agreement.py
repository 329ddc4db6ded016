"""Subject–verb agreement from a small grammar: does the verb take the subject's number?

After Linzen et al. (2016), "Assessing the Ability of LSTMs to Learn Syntax-Sensitive
Dependencies": a model reads an English sentence up to its main verb and says whether the verb is
singular or plural. Nouns of the other number between the subject and the verb (*attractors*)
make the task hard for a model that looks at the nearest noun. The sentences here come from a
small grammar, so that every example is exact and the task needs no download
(Abnar & Zuidema 2020 used it to compare attention rollout and flow with blank-out importance)::

    S   → (Adv) NP_subj M^k <cls>      k uniform in min_modifiers … max_modifiers
    NP  → the (Adj) N                  N singular or plural
    M   → PP | RC
    PP  → P NP                         "near the old keys"
    RC  → that NP V                    an object relative clause: "that the boys see";
                                       V agrees with the clause's own NP, never with NP_subj

The label is the number of ``NP_subj``'s noun (the verb that would follow ``<cls>``). The
subject's determiner is always ``the``, so its noun is the only word that carries the label; a
modifier's noun (and a relative clause's verb) has a random number, the other number than the
subject's about half of the time (an attractor). The classifying token ``<cls>`` comes last, so a
causal language model reads the whole sentence at it and predicts ``<sg>`` or ``<pl>`` there.

The held-out split is a hash of the sentence (as in :mod:`attnlab.data.toy_sequences`): a
sentence with ``crc32(words) mod heldout_modulus == 0`` is never drawn for training.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from attnlab.errors import ArgumentError, ArgumentTypeError

__all__ = [
    "SPECIALS",
    "VOCABULARY",
    "AgreementExample",
    "agreement_batch",
    "is_heldout",
    "sample_agreement",
]

#: padding, the blank that replaces a removed token, the classifying token, the two labels
SPECIALS: tuple[str, ...] = ("<pad>", "<blank>", "<cls>", "<sg>", "<pl>")
_NOUNS = (
    ("dog", "dogs"),
    ("cat", "cats"),
    ("boy", "boys"),
    ("girl", "girls"),
    ("key", "keys"),
    ("book", "books"),
    ("friend", "friends"),
    ("teacher", "teachers"),
)
_VERBS = (("sees", "see"), ("likes", "like"), ("knows", "know"), ("finds", "find"))
_ADJECTIVES = ("big", "small", "old", "new", "red")
_PREPOSITIONS = ("near", "behind", "with", "under", "of")
_ADVERBS = ("today", "often", "sometimes")
#: every token: the specials, then the words
VOCABULARY: tuple[str, ...] = (
    *SPECIALS,
    "the",
    "that",
    *_ADVERBS,
    *_ADJECTIVES,
    *_PREPOSITIONS,
    *(w for pair in _NOUNS for w in pair),
    *(w for pair in _VERBS for w in pair),
)
_ID = {w: i for i, w in enumerate(VOCABULARY)}
_CHOICE_P = 0.5  # the chance of each optional part: Adv, Adj, PP rather than RC, each number


@dataclass(frozen=True)
class AgreementExample:
    """One sentence of the grammar and its label.

    Attributes:
        words: the tokens, ``<cls>`` last.
        ids: their ids in :data:`VOCABULARY`.
        plural: whether the subject (so the verb) is plural.
        subject: the position of the subject's noun.
        attractors: how many nouns after the subject have the other number.
    """

    words: tuple[str, ...]
    ids: tuple[int, ...]
    plural: bool
    subject: int
    attractors: int

    @property
    def label(self) -> int:
        """The id of the label token, ``<sg>`` or ``<pl>``."""
        return _ID["<pl>" if self.plural else "<sg>"]


def is_heldout(words: tuple[str, ...], heldout_modulus: int = 10) -> bool:
    """Whether a sentence belongs to the held-out split (a hash of its words).

    Args:
        words: the sentence's tokens.
        heldout_modulus: one sentence in about this many is held out.

    Returns:
        ``True`` for a held-out sentence, never drawn for training.
    """
    return zlib.crc32(" ".join(words).encode()) % heldout_modulus == 0


def _pick(options: tuple[str, ...], g: torch.Generator) -> str:
    return options[int(torch.randint(len(options), (1,), generator=g))]


def _coin(g: torch.Generator) -> bool:
    return bool(torch.rand((), generator=g) < _CHOICE_P)


def _noun_phrase(plural: bool, g: torch.Generator) -> list[str]:
    words = ["the"] + ([_pick(_ADJECTIVES, g)] if _coin(g) else [])
    return [*words, _NOUNS[int(torch.randint(len(_NOUNS), (1,), generator=g))][int(plural)]]


def _sentence(min_modifiers: int, max_modifiers: int, g: torch.Generator) -> AgreementExample:
    plural = _coin(g)
    words = [_pick(_ADVERBS, g)] if _coin(g) else []
    words += _noun_phrase(plural, g)
    subject = len(words) - 1
    attractors = 0
    for _ in range(int(torch.randint(min_modifiers, max_modifiers + 1, (1,), generator=g))):
        number = _coin(g)  # the modifier's noun: the other number about half of the time
        attractors += number != plural
        if _coin(g):  # PP → P NP
            words += [_pick(_PREPOSITIONS, g), *_noun_phrase(number, g)]
        else:  # RC → that NP V, V agreeing with the clause's NP
            verb = _VERBS[int(torch.randint(len(_VERBS), (1,), generator=g))][int(number)]
            words += ["that", *_noun_phrase(number, g), verb]
    words.append("<cls>")
    return AgreementExample(tuple(words), tuple(_ID[w] for w in words), plural, subject, attractors)


def sample_agreement(
    n: int,
    *,
    seed: int,
    heldout: bool = False,
    max_modifiers: int = 3,
    min_modifiers: int = 0,
    heldout_modulus: int = 10,
) -> list[AgreementExample]:
    """``n`` sentences of the grammar (see the module docstring), from the training or the
    held-out split.

    Args:
        n: how many.
        seed: the sentences depend only on it (and the other arguments).
        heldout: draw from the held-out split instead of the training one.
        max_modifiers: the most PPs and RCs after the subject (0 … 5): a sentence has at most
            ``1 + 3 + 5 · max_modifiers + 1`` tokens, 30 for 5 (flow accepts up to 32).
        min_modifiers: the fewest (0 … max_modifiers); the number is uniform in between.
        heldout_modulus: one sentence in about this many is held out (>= 2).

    Returns:
        The examples, in the order drawn.

    Raises:
        ArgumentError: an argument out of its range.
    """
    for name, value in (
        ("n", n),
        ("seed", seed),
        ("max_modifiers", max_modifiers),
        ("min_modifiers", min_modifiers),
        ("heldout_modulus", heldout_modulus),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if n < 0:
        raise ArgumentError(f"n must be >= 0, got {n}")
    if not 0 <= max_modifiers <= 5:
        raise ArgumentError(f"max_modifiers must be in [0, 5], got {max_modifiers}")
    if not 0 <= min_modifiers <= max_modifiers:
        raise ArgumentError(
            f"min_modifiers must be in [0, max_modifiers = {max_modifiers}], got {min_modifiers}"
        )
    if heldout_modulus < 2:
        raise ArgumentError(f"heldout_modulus must be >= 2, got {heldout_modulus}")
    g = torch.Generator().manual_seed(seed)
    out: list[AgreementExample] = []
    while len(out) < n:
        example = _sentence(min_modifiers, max_modifiers, g)
        if is_heldout(example.words, heldout_modulus) == heldout:
            out.append(example)
    return out


def agreement_batch(
    examples: list[AgreementExample],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Examples as one right-padded batch for a causal model: a row's padding comes after its
    ``<cls>``, so it changes nothing the model computes at ``<cls>``.

    Args:
        examples: the sentences (at least one).

    Returns:
        ``(ids, cls, labels)``: the token ids padded with ``<pad>``, the position of each row's
        ``<cls>``, and each row's label token id.

    Shape:
        ids ``(B, T_max)``; cls, labels ``(B,)``.
    """
    if not examples:
        raise ArgumentError("examples must hold at least one sentence, got none")
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), _ID["<pad>"], dtype=torch.long)
    for row, e in enumerate(examples):
        ids[row, : len(e.ids)] = torch.tensor(e.ids)
    cls = torch.tensor([len(e.ids) - 1 for e in examples])
    labels = torch.tensor([e.label for e in examples])
    return ids, cls, labels
