"""The KV-cache keyword of a transformers model, across the rename of ``past_key_values``.

transformers 5.2x renamed the cache argument of ``forward`` (and the field of its outputs) from
``past_key_values`` to ``cache``; the old name still works but logs a deprecation warning on every
run and goes away in 5.40. agent-r1 supports transformers from 4.56, so it asks the model which
name its ``forward`` takes instead of assuming either.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["cache_keyword", "output_cache", "with_cache"]

_KEYWORDS: dict[type, str] = {}


def cache_keyword(model: Any) -> str:
    """``"cache"`` when ``model.forward`` declares that parameter, else ``"past_key_values"``."""
    kind = type(model)
    keyword = _KEYWORDS.get(kind)
    if keyword is None:
        try:
            parameters = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):  # a forward inspect cannot read: keep the long-standing name
            parameters = {}  # type: ignore[assignment]
        keyword = "cache" if "cache" in parameters else "past_key_values"
        _KEYWORDS[kind] = keyword
    return keyword


def with_cache(model: Any, cache: Any) -> dict[str, Any]:
    """The keyword arguments that hand ``cache`` to ``model.forward`` (empty when it is ``None``)."""
    return {} if cache is None else {cache_keyword(model): cache}


def output_cache(outputs: Any) -> Any:
    """The KV cache a forward pass returned, read through whichever field the outputs carry."""
    fields = outputs.keys() if hasattr(outputs, "keys") else ()
    if "cache" in fields:
        return outputs["cache"]
    return outputs.past_key_values
