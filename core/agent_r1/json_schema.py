"""Tool arguments described by a JSON schema that another package wrote (an MCP server's listing,
a verifiers tool server, an OpenEnv action schema): :func:`arguments_model` makes the pydantic
model a :class:`~agent_r1.Tool`'s ``Arguments`` needs from the schema's top level.

Each property is typed by its JSON ``type`` (anything when absent, a union or a reference),
required ones are required, the others optional (left out of the call when not given), and extra
keys are refused unless ``additionalProperties`` allows them. A property whose name pydantic
cannot take as a field (a keyword, a name ``BaseModel`` uses, a non-identifier) becomes
``field_<index>`` with the original name as its alias. Deeper constraints (nested objects, enums,
ranges) are left to the package, which reports a violation as an error the agent reads.
"""

from __future__ import annotations

import keyword
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

__all__ = ["arguments_model"]

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list[Any],
    "object": dict[str, Any],
    "null": type(None),
}
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def arguments_model(tool_name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A pydantic model for the top level of the JSON object ``schema`` of tool ``tool_name`` (see
    the module docstring)."""
    properties: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    fields: dict[str, Any] = {}
    taken = set(dir(BaseModel))
    for index, (key, spec) in enumerate(properties.items()):
        spec = spec if isinstance(spec, dict) else {}
        kind = spec.get("type")
        annotation = _JSON_TYPES.get(kind, Any) if isinstance(kind, str) else Any
        description = spec.get("description")
        usable = _IDENTIFIER.fullmatch(key) and not keyword.iskeyword(key) and key not in taken
        attribute = key if usable else f"field_{index}"
        alias = None if usable else key
        if key in required:
            fields[attribute] = (annotation, Field(..., alias=alias, description=description))
        else:
            optional = annotation if annotation is Any else annotation | None
            fields[attribute] = (optional, Field(None, alias=alias, description=description))
    extra: Literal["allow", "forbid"] = (
        "allow" if schema.get("additionalProperties") not in (None, False) else "forbid"
    )
    model_config = ConfigDict(extra=extra, populate_by_name=True)
    return create_model(re.sub(r"\W", "_", tool_name) + "Arguments", __config__=model_config, **fields)
