"""Small public datasets that ship with attnlab, so that training needs no download.

Each dataset lies in this package, compressed with xz, beside a ``LICENSE.txt`` that states its
source and licence:

* ``tinyshakespeare`` — 1,115,394 characters of Shakespeare's plays (karpathy/char-rnn; the text
  is in the public domain, the repository MIT); a text for ``attnlab train lm``.
* ``small_parallel_enja`` — 50,000 + 500 + 500 English–Japanese sentence pairs
  (odashi/small_parallel_enja, from the Tanaka Corpus, CC BY 2.0 FR); the splits ``train``,
  ``dev`` and ``test`` for ``attnlab train translate``.

Examples:
    >>> from attnlab.data import corpora
    >>> sorted(corpora.available())
    ['small_parallel_enja', 'tinyshakespeare']
    >>> corpora.load_text("tinyshakespeare")[:14]
    'First Citizen:'
    >>> pairs = corpora.load_parallel("small_parallel_enja", "dev")
    >>> len(pairs)
    500
"""

from __future__ import annotations

import lzma
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

from attnlab.data.parallel import ParallelCorpus, pair_lines, split_lines
from attnlab.errors import ArgumentError

__all__ = [
    "Dataset",
    "available",
    "dataset",
    "is_dataset",
    "licence_text",
    "load_parallel",
    "load_text",
    "names",
    "resource_file",
]

#: the splits of a parallel dataset
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Dataset:
    """A dataset packaged with attnlab.

    Attributes:
        name: its name (``attnlab train lm --data NAME``, ``translate --corpus NAME``).
        kind: ``"text"`` (one text: :func:`load_text`) or ``"parallel"`` (sentence pairs by
            split: :func:`load_parallel`).
        description: what it holds.
        source: where it comes from.
        licence: its licence, in short (``LICENSE.txt`` beside it says it in full).
        languages: ``(source, target)`` language codes of a parallel dataset, else ``()``.
        files: the packaged files (xz), relative to the dataset's folder.
    """

    name: str
    kind: Literal["text", "parallel"]
    description: str
    source: str
    licence: str
    languages: tuple[str, ...]
    files: tuple[str, ...]


_DATASETS = (
    Dataset(
        name="tinyshakespeare",
        kind="text",
        description="1,115,394 characters of Shakespeare's plays (nanoGPT's shakespeare_char)",
        source="https://github.com/karpathy/char-rnn (data/tinyshakespeare/input.txt)",
        licence="public domain text; the char-rnn repository is MIT",
        languages=(),
        files=("input.txt.xz",),
    ),
    Dataset(
        name="small_parallel_enja",
        kind="parallel",
        description="English–Japanese sentence pairs, tokenized with spaces, English lowercased: "
        "50,000 train, 500 dev, 500 test",
        source="https://github.com/odashi/small_parallel_enja (from the Tanaka Corpus)",
        licence="CC BY 2.0 FR (the Tanaka Corpus)",
        languages=("en", "ja"),
        files=tuple(f"{split}.{lang}.xz" for split in SPLITS for lang in ("en", "ja")),
    ),
)


def available() -> dict[str, Dataset]:
    """The packaged datasets by name.

    Returns:
        Name → :class:`Dataset`.
    """
    return {d.name: d for d in _DATASETS}


def names(kind: str | None = None) -> list[str]:
    """The names of the packaged datasets.

    Args:
        kind: ``"text"`` or ``"parallel"`` for that kind only; ``None`` for all.

    Returns:
        Their names, in a fixed order.
    """
    return [d.name for d in _DATASETS if kind is None or d.kind == kind]


def is_dataset(name: object, *, kind: str | None = None) -> bool:
    """Whether ``name`` names a packaged dataset (a command-line value that is not a path).

    Args:
        name: a ``--data`` value, for instance.
        kind: ``"text"`` or ``"parallel"`` to accept only that kind; ``None`` accepts both.

    Returns:
        True for the name of a packaged dataset (of that kind).
    """
    found = available().get(name) if isinstance(name, str) else None
    return found is not None and (kind is None or found.kind == kind)


def dataset(name: str, *, kind: str | None = None) -> Dataset:
    """The packaged dataset called ``name``.

    Args:
        name: its name.
        kind: ``"text"`` or ``"parallel"`` to accept only that kind; ``None`` accepts both.

    Returns:
        Its :class:`Dataset`.

    Raises:
        ValueError: no such dataset (of that kind); the message lists the known ones.
    """
    known = names(kind)
    if not is_dataset(name, kind=kind):
        what = "dataset" if kind is None else f"{kind} dataset"
        raise ArgumentError(f"name must be a packaged {what} ({', '.join(known)}), got {name!r}")
    return available()[name]


def _folder(name: str) -> Traversable:
    return resources.files(__name__).joinpath(name)


def resource_file(name: str, file: str) -> Path | None:
    """Where a packaged file of a dataset lies on disk, to fingerprint it (see
    :mod:`attnlab.training.data_files`).

    Args:
        name: the dataset.
        file: one of its :attr:`Dataset.files`.

    Returns:
        The file's path, or ``None`` when the package is not on the file system (a zip).

    Raises:
        ValueError: an unknown dataset or file.
    """
    ds = dataset(name)
    if file not in ds.files:
        raise ArgumentError(f"file must be one of {', '.join(ds.files)}, got {file!r}")
    entry = _folder(name).joinpath(file)
    return Path(str(entry)) if isinstance(entry, Path) else None


@cache
def _read(name: str, file: str) -> str:
    with _folder(name).joinpath(file).open("rb") as f, lzma.open(f) as xz:
        return xz.read().decode("utf-8")


def load_text(name: str) -> str:
    """The whole text of a packaged text dataset (decompressed once, then cached).

    Args:
        name: a ``"text"`` dataset (``"tinyshakespeare"``).

    Returns:
        The text.

    Raises:
        ValueError: ``name`` is not a packaged text dataset.
    """
    ds = dataset(name, kind="text")
    return _read(ds.name, ds.files[0])


def load_parallel(name: str, split: str = "train") -> ParallelCorpus:
    """One split of a packaged parallel dataset, as sentence pairs (blank pairs dropped, as
    :func:`attnlab.data.parallel.read_parallel`).

    Args:
        name: a ``"parallel"`` dataset (``"small_parallel_enja"``).
        split: ``"train"``, ``"dev"`` or ``"test"``. Default ``"train"``.

    Returns:
        The pairs: ``src`` in the first language, ``tgt`` in the second.

    Raises:
        ValueError: ``name`` is not a packaged parallel dataset, or ``split`` is unknown.
    """
    ds = dataset(name, kind="parallel")
    if split not in SPLITS:
        raise ArgumentError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    src_lang, tgt_lang = ds.languages
    src = split_lines(_read(ds.name, f"{split}.{src_lang}.xz"))
    tgt = split_lines(_read(ds.name, f"{split}.{tgt_lang}.xz"))
    return pair_lines(src, tgt)


def licence_text(name: str) -> str:
    """The ``LICENSE.txt`` of a packaged dataset: its source, licence and attribution.

    Args:
        name: the dataset.

    Returns:
        The text.

    Raises:
        ValueError: ``name`` is not a packaged dataset.
    """
    ds = dataset(name)
    return _folder(ds.name).joinpath("LICENSE.txt").read_text(encoding="utf-8")
