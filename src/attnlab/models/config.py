"""Model configurations: frozen dataclasses, validated in ``__post_init__``, saved as JSON."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TypeVar

__all__ = ["config_from_dict", "config_to_dict"]

C = TypeVar("C")


def config_to_dict(config: object) -> dict[str, Any]:
    """A config as a JSON-ready dict, with its class name under ``"kind"``."""
    return {"kind": type(config).__name__, **dataclasses.asdict(config)}  # type: ignore[call-overload]


def config_from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Rebuild a config; unknown keys are an error that names them."""
    data = {k: v for k, v in data.items() if k != "kind"}
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
    return cls(**data)


def dumps(config: object) -> str:
    return json.dumps(config_to_dict(config), indent=2, sort_keys=True)


# --- TransformerConfig (encoder-decoder) goes below this line ---


# --- GPTConfig goes below this line ---
