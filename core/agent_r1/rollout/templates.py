"""Chat-template configuration: the run's ``model.chat_template`` and ``model.chat_template_kwargs``
installed on a loaded tokenizer (:func:`apply_chat_template_config`), checked before the model loads
(:func:`check_chat_template_config`), and read back by every
:class:`~agent_r1.rollout.chat.ChatRenderer` of that tokenizer (:func:`configured_template_kwargs`)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_r1.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

    from agent_r1.config import ModelConfig


__all__ = [
    "CHAT_TEMPLATE_KWARGS_ATTRIBUTE",
    "TemplateWarning",
    "apply_chat_template_config",
    "check_chat_template_config",
    "configured_template_kwargs",
    "load_chat_template",
]


CHAT_TEMPLATE_KWARGS_ATTRIBUTE = "agent_r1_chat_template_kwargs"
"""Attribute of a tokenizer holding the run's ``model.chat_template_kwargs`` (set by
:func:`apply_chat_template_config`); every :class:`ChatRenderer` of that tokenizer uses them."""


_CHAT_TEMPLATE_SOURCE_ATTRIBUTE = "agent_r1_chat_template_source"
"""Attribute of a tokenizer naming where its configured template came from (for messages)."""


class TemplateWarning(UserWarning):
    """The chat template is not prefix-preserving: multi-turn rollouts will show template drift."""


def load_chat_template(value: str, *, where: str = "model.chat_template") -> str:
    """The Jinja text that ``value`` stands for, syntax-checked.

    A value containing ``{{`` or ``{%`` is the template itself; any other value is the path of a
    file holding it (typically ``.jinja``; ``~`` is expanded, a relative path is relative to the
    working directory). Raises :class:`~agent_r1.errors.ConfigError` naming ``where`` when the file
    cannot be read or the template has a Jinja syntax error (with its line).
    """
    if "{{" in value or "{%" in value:
        text, origin = value, "the template text"
    else:
        path = Path(value).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"{where}: {value!r} is not a file (a value without '{{{{' or '{{%' is read as the path "
                f"of a Jinja template file; looked for {str(path.absolute())!r}). Give the path of an "
                "existing .jinja file, or the template text itself.",
                path=where,
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read {str(path)!r}: {exc}", path=where) from None
        if not text.strip():
            raise ConfigError(f"{where}: the template file {str(path)!r} is empty", path=where)
        origin = str(path)
    import jinja2

    try:  # compiled as transformers compiles it ({% generation %} and its other extensions included)
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # pragma: no cover - an older transformers: its documented extension only

        def _compile_jinja_template(source: str) -> Any:
            return jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source)

    try:
        _compile_jinja_template(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(
            f"{where}: Jinja syntax error in {origin} at line {exc.lineno}: {exc.message}", path=where
        ) from None
    return text


def _reserved_template_kwargs() -> set[str]:
    """Names ``apply_chat_template`` takes itself, so they cannot be template variables."""
    from transformers import PreTrainedTokenizerBase

    parameters = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters.values()
    return {p.name for p in parameters if p.kind is not p.VAR_KEYWORD and p.name != "self"}


def check_template_kwargs(kwargs: Mapping[str, Any], where: str) -> None:
    clash = sorted(set(kwargs) & _reserved_template_kwargs())
    if clash:
        raise ConfigError(
            f"{where}: {', '.join(map(repr, clash))} "
            f"{'is an argument' if len(clash) == 1 else 'are arguments'} of apply_chat_template that "
            "agent-r1 sets itself, not a template variable; remove "
            f"{'it' if len(clash) == 1 else 'them'} (template variables are names such as enable_thinking)",
            path=where,
        )


def check_chat_template_config(model_config: ModelConfig) -> str | None:
    """Check ``model.chat_template`` and ``model.chat_template_kwargs`` without a tokenizer (for a
    preflight): the template file is readable, the template parses, no kwarg clashes with an
    argument of ``apply_chat_template``. Returns the template text (``None`` when not configured);
    raises :class:`~agent_r1.errors.ConfigError` naming the config path."""
    check_template_kwargs(model_config.chat_template_kwargs, "model.chat_template_kwargs")
    if model_config.chat_template is None:
        return None
    return load_chat_template(model_config.chat_template)


def apply_chat_template_config(
    tokenizer: PreTrainedTokenizerBase, model_config: ModelConfig
) -> PreTrainedTokenizerBase:
    """Install the run config's chat template settings on a loaded ``tokenizer`` and return it.

    ``model.chat_template`` (template text or a file path, see :func:`load_chat_template`) replaces
    ``tokenizer.chat_template``, so that everything using the tokenizer renders with it and a saved
    tokenizer (checkpoints, the final export) carries it. ``model.chat_template_kwargs`` are
    recorded on the tokenizer (:data:`CHAT_TEMPLATE_KWARGS_ATTRIBUTE`); every
    :class:`ChatRenderer` built on it passes them to ``apply_chat_template``. Without either
    setting the tokenizer is returned unchanged. Call it right after loading the tokenizer, before
    any renderer or rollout backend is built. Raises :class:`~agent_r1.errors.ConfigError`.
    """
    template = check_chat_template_config(model_config)
    if template is not None:
        tokenizer.chat_template = template
        source = model_config.chat_template
        described = "the template text" if template == source else f"file {source!r}"
        setattr(tokenizer, _CHAT_TEMPLATE_SOURCE_ATTRIBUTE, f"model.chat_template ({described})")
    setattr(tokenizer, CHAT_TEMPLATE_KWARGS_ATTRIBUTE, dict(model_config.chat_template_kwargs))
    return tokenizer


def configured_template_kwargs(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """The ``model.chat_template_kwargs`` recorded on ``tokenizer`` (empty when none)."""
    return dict(getattr(tokenizer, CHAT_TEMPLATE_KWARGS_ATTRIBUTE, None) or {})


def template_origin(tokenizer: PreTrainedTokenizerBase) -> str:
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    default = f"the chat template of tokenizer {name!r}"
    return str(getattr(tokenizer, _CHAT_TEMPLATE_SOURCE_ATTRIBUTE, default))
