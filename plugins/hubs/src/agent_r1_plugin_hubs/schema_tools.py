"""Tools whose arguments another package describes with a JSON schema: a verifiers tool server's
listing (``verifiers_hub``) and an OpenEnv environment's action schema (``openenv_hub``).

:func:`schema_tool_class` makes a :class:`~agent_r1.Tool` subclass whose ``schema()`` is the
package's own schema (what the chat template or the format shows the model) and whose
``Arguments`` is the pydantic model :func:`agent_r1.json_schema.arguments_model` derives from it
(top-level properties with their JSON types, required ones required, unknown keys refused; the
MCP plugin uses the same for MCP listings).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel

from agent_r1 import Tool
from agent_r1.json_schema import arguments_model

__all__ = ["SchemaTool", "schema_tool_class"]


ToolT = TypeVar("ToolT", bound="SchemaTool")


class SchemaTool(Tool):
    """Base of the tool classes made by :func:`schema_tool_class`: ``input_schema`` is the
    package's JSON schema of the arguments, shown to the model as is."""

    input_schema: ClassVar[dict[str, Any]] = {}

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The package's own schema of the tool, in the OpenAI function form."""
        return {
            "type": "function",
            "function": {"name": cls.name, "description": cls.description, "parameters": cls.input_schema},
        }

    @staticmethod
    def payload(arguments: BaseModel) -> dict[str, Any]:
        """The validated ``arguments`` as the JSON object the package receives (keys as the schema
        spells them; optional ones left out unless given)."""
        return arguments.model_dump(mode="json", by_alias=True, exclude_unset=True)


def schema_tool_class(
    base: type[ToolT], *, name: str, description: str, schema: dict[str, Any], **attributes: Any
) -> type[ToolT]:
    """A subclass of ``base`` named ``name`` for the model, with ``schema`` (a JSON object schema)
    as its arguments; ``attributes`` become class attributes."""
    schema = dict(schema or {"type": "object", "properties": {}})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    schema.pop("title", None)
    namespace: dict[str, Any] = {
        "name": name,
        "description": description,
        "input_schema": schema,
        "Arguments": arguments_model(name, schema),
        "__module__": base.__module__,
        "__doc__": f"{name}: {description}",
        **attributes,
    }
    class_name = base.__name__ + "_" + re.sub(r"\W", "_", name)
    return type(class_name, (base,), namespace)
