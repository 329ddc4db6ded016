"""Durable file writes, for the training side's importers: see :mod:`attnlab._files`, the leaf
that every layer may use (``models`` writes its Hugging Face folders with it)."""

from __future__ import annotations

from attnlab._files import (
    fsync_dir,
    fsync_file,
    naming,
    replace_file,
    replace_with,
    safetensors_bytes,
    write_synced,
)

__all__ = [
    "fsync_dir",
    "fsync_file",
    "naming",
    "replace_file",
    "replace_with",
    "safetensors_bytes",
    "write_synced",
]
