"""Chat-template rendering for token-faithful multi-turn rollouts.

A trajectory grows by appending: the rendered prompt, the tokens the policy sampled, then the
tokens of each observation. :class:`ChatRenderer` produces the appended pieces so that the
sequence stays byte-for-byte what the model saw, never re-rendering (or re-tokenising) earlier
turns:

* :meth:`ChatRenderer.render_prompt`: the task's messages (and tool schemas) with the generation
  prompt, e.g. ``...<|im_start|>assistant\\n``.
* :meth:`ChatRenderer.render_observation`: after an action, three pieces (see
  :class:`ObservationTokens`): the *closure* of the assistant turn that the policy did not sample
  (``<|im_end|>\\n`` after a stop sequence or a length cut; only ``\\n`` when the policy sampled
  ``<|im_end|>`` itself), the observation messages (``<|im_start|>tool\\n...<|im_end|>\\n``) and the
  *header* that opens the next assistant message (``<|im_start|>assistant\\n``).

The pieces come from text differences of renders of a fixed probe conversation, so any Jinja chat
template works without knowing its markup: render ``[user, assistant]`` and
``[user, assistant, *observation]`` and take the suffix. Each render is checked to be a clean
extension of the previous one; a template that rewrites earlier turns when later messages arrive
(drops earlier assistant turns or their reasoning, moves the system prompt...) is detected when
the renderer is built, with a probe conversation, and reported in
:attr:`ChatRenderer.template_issues` (an :class:`~agent_r1.errors.AgentR1Error` with ``strict``).

Whatever the template does, the engine keeps the tokens the model actually saw. How far they are
from a full re-render of the conversation is measured by :meth:`ChatRenderer.drift` (logged as
``rollout/template_drift_tokens``) and never used to change tokens.

The run config can replace the tokenizer's template and pass variables to it (``model.chat_template``,
``model.chat_template_kwargs``): :func:`~agent_r1.rollout.templates.apply_chat_template_config`
installs both on a loaded tokenizer, and every :class:`ChatRenderer` of that tokenizer then renders
prompts, observations and the drift reference with them.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_r1.errors import AgentR1Error
from agent_r1.mdp import Message
from agent_r1.rollout.templates import (
    TemplateWarning,
    check_template_kwargs,
    configured_template_kwargs,
    template_origin,
)

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase


__all__ = [
    "TRUNCATION_MARKER",
    "ChatRenderer",
    "ObservationTokens",
    "end_of_turn_token_ids",
]


TRUNCATION_MARKER = " [truncated]"
"""Appended to an observation message whose content was cut to fit the context."""

_PROBE_USER = "agent-r1 probe question"
_PROBE_ASSISTANT = "agent-r1 probe answer 7c1e"
_PROBE_OBSERVATION = "agent-r1 probe observation"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "A probe tool.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


# --------------------------------------------------------------------------------------------
# The run config's chat template (model.chat_template, model.chat_template_kwargs)
# --------------------------------------------------------------------------------------------


@dataclass
class ObservationTokens:
    """Tokens appended after an action: ``closure`` (template, turn ``t``), ``env`` (environment,
    turn ``t``) and ``header`` (template, turn ``t + 1``). ``messages`` are the messages actually
    rendered (contents may be cut, see ``cut``)."""

    closure: list[int]
    env: list[int]
    header: list[int]
    messages: list[Message]
    cut: bool = False
    """True when message contents were shortened to fit ``max_tokens``."""

    def __len__(self) -> int:
        return len(self.closure) + len(self.env) + len(self.header)

    @property
    def token_ids(self) -> list[int]:
        return [*self.closure, *self.env, *self.header]


class ChatRenderer:
    """Renders prompts and observations for one tokenizer's chat template, prefix-preserving.

    ``template_kwargs`` are passed to every ``apply_chat_template`` call (e.g.
    ``{"enable_thinking": False}``), on top of the run's ``model.chat_template_kwargs`` that
    :func:`apply_chat_template_config` recorded on the tokenizer. The constructor probes the
    template: it raises :class:`~agent_r1.errors.AgentR1Error` when the template cannot be used at
    all (no template, no generation prompt, assistant content not rendered verbatim), and records in
    :attr:`template_issues` (warning once, or raising with ``strict=True``) where incremental
    rendering differs from a full re-render.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        strict: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise AgentR1Error(
                f"tokenizer {type(tokenizer).__name__} ({getattr(tokenizer, 'name_or_path', '?')}) has no "
                "chat template; multi-turn rollouts render messages with it. Set model.chat_template in "
                "the run config (a Jinja string or a .jinja file) or use an instruct model's tokenizer."
            )
        self.tokenizer = tokenizer
        self.template_kwargs = {**configured_template_kwargs(tokenizer), **(template_kwargs or {})}
        check_template_kwargs(self.template_kwargs, "chat template kwargs")
        self.template_issues: list[str] = []
        """Where incremental rendering is not prefix-preserving (empty for a well-behaved template)."""
        self._base: list[Message] = [
            {"role": "user", "content": _PROBE_USER},
            {"role": "assistant", "content": _PROBE_ASSISTANT},
        ]
        self._base_text = self.render_text(self._base, add_generation_prompt=False)
        self.closure_text, self.header_text = self._probe_turn()
        self._closure_ids = self.encode(self.closure_text)
        self._probe_observations()
        self._probe_conversation()
        if self.template_issues:
            summary = "; ".join(self.template_issues)
            if strict:
                raise AgentR1Error(f"the chat template is not prefix-preserving: {summary}")
            warnings.warn(
                f"the chat template is not prefix-preserving: {summary}. The rollout keeps the tokens "
                "the model saw; rollout/template_drift_tokens measures the difference from a full "
                "re-render.",
                TemplateWarning,
                stacklevel=2,
            )

    @property
    def prefix_preserving(self) -> bool:
        """True when the probes found no difference between incremental and full rendering."""
        return not self.template_issues

    @property
    def end_of_turn_ids(self) -> list[int]:
        """The special token(s) that end an assistant turn (e.g. ``<|im_end|>``), from the template."""
        special = _special_ids(self.tokenizer)
        return [self._closure_ids[0]] if self._closure_ids and self._closure_ids[0] in special else []

    # -- rendering ------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text (special tokens in the text become their ids; no BOS added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        """The chat template applied to ``messages`` (errors become :class:`AgentR1Error`)."""
        try:
            text = self.tokenizer.apply_chat_template(
                list(messages),
                tools=[dict(tool) for tool in tools] if tools else None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self.template_kwargs,
            )
        except Exception as exc:
            roles = ", ".join(str(m.get("role")) for m in messages)
            variables = f" with variables {self.template_kwargs}" if self.template_kwargs else ""
            raise AgentR1Error(
                f"{template_origin(self.tokenizer)} failed to render messages with roles [{roles}]"
                f"{variables}: {type(exc).__name__}: {exc}"
            ) from exc
        return str(text)

    def render_prompt(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of the task's messages (with ``tools`` schemas when given) and the generation
        prompt that opens the first assistant message."""
        return self.encode(self.render_text(messages, tools, add_generation_prompt=True))

    def closure_ids(self, action_ids: Sequence[int], finish_reason: str) -> list[int]:
        """Template tokens that close an assistant turn after ``action_ids``: the whole closure
        (``<|im_end|>\\n``) unless the policy sampled the end-of-turn token itself (finish reason
        ``eos``), in which case only what follows that token (``\\n``)."""
        closure = list(self._closure_ids)
        if finish_reason == "eos" and action_ids and action_ids[-1] in closure:
            return closure[closure.index(action_ids[-1]) + 1 :]
        return closure

    def action_text(self, action_ids: Sequence[int], finish_reason: str) -> str:
        """The action as text for tool-call parsing: decoded without the final EOS token."""
        ids = list(action_ids[:-1] if finish_reason == "eos" and action_ids else action_ids)
        return self._decode(ids)

    def action_content(self, action_ids: Sequence[int], finish_reason: str) -> str:
        """The assistant message content that re-renders ``action_ids`` (the end-of-turn token is
        the template's, not the content's)."""
        ids = list(action_ids)
        if finish_reason == "eos" and ids and ids[-1] in self._closure_ids:
            ids = ids[:-1]
        return self._decode(ids)

    def render_observation(
        self,
        messages: Sequence[Message],
        *,
        action_ids: Sequence[int],
        finish_reason: str,
        max_tokens: int | None = None,
    ) -> ObservationTokens | None:
        """Tokens to append after an action: its closure, the observation ``messages`` and the next
        assistant header.

        With ``max_tokens``, message contents are cut (longest first, marked with
        :data:`TRUNCATION_MARKER`) so that all three pieces fit; returns ``None`` when even empty
        contents do not fit. Raises :class:`AgentR1Error` when the template cannot render these
        messages as a clean suffix of the conversation.
        """
        closure = self.closure_ids(action_ids, finish_reason)
        rendered = [dict(m) for m in messages]
        env, header = self._observation_ids(rendered)
        result = ObservationTokens(closure, env, header, rendered)
        if max_tokens is None or len(result) <= max_tokens:
            return result
        budget = max_tokens - len(closure) - len(header)
        fitted = self._fit(rendered, budget) if budget > 0 else None
        if fitted is None:
            return None
        env, header = self._observation_ids(fitted)
        return ObservationTokens(closure, env, header, fitted, cut=True)

    def drift(
        self,
        messages: Sequence[Message],
        token_ids: Sequence[int],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        """How many tokens ``token_ids`` differ from a full render of ``messages`` (with the
        generation prompt when the last message is not the assistant's): after stripping the
        common prefix and suffix, the length of the longer remainder. 0 means identical.

        ``token_ids`` must cover the whole conversation: end it with :meth:`closure_ids` of the
        last action when the conversation ends on an assistant message.
        """
        ends_open = not messages or messages[-1].get("role") != "assistant"
        reference = self.encode(self.render_text(messages, tools, add_generation_prompt=ends_open))
        return _difference(reference, list(token_ids))

    # -- internals ------------------------------------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def _observation_text(self, messages: Sequence[Message]) -> tuple[str, str]:
        """``(env_text, header_text)`` for ``messages`` appended after an assistant turn."""
        conversation = [*self._base, *messages]
        closed = self.render_text(conversation, add_generation_prompt=False)
        opened = self.render_text(conversation, add_generation_prompt=True)
        roles = ", ".join(str(m.get("role")) for m in messages) or "no messages"
        if not closed.startswith(self._base_text):
            at = _first_difference(closed, self._base_text)
            raise AgentR1Error(
                f"the chat template is not prefix-preserving for observations ({roles}): rendering "
                f"them after an assistant turn changes the earlier text at character {at} "
                f"({self._base_text[at : at + 40]!r} becomes {closed[at : at + 40]!r}); the template "
                "rewrites earlier turns (e.g. drops past assistant messages or their reasoning). "
                "Use a template that only appends, or send observations with another role."
            )
        if not opened.startswith(closed):
            raise AgentR1Error(
                "the chat template's generation prompt is not a suffix: rendering with "
                "add_generation_prompt=True changes the text of the conversation before it"
            )
        return closed[len(self._base_text) :], opened[len(closed) :]

    def _observation_ids(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        env_text, header_text = self._observation_text(messages)
        return self.encode(env_text), self.encode(header_text)

    def _fit(self, messages: list[Message], budget: int) -> list[Message] | None:
        """Shorten text contents, longest first, until the env tokens fit ``budget``."""
        fitted = [dict(m) for m in messages]
        cut: set[int] = set()

        def size() -> int:
            return len(self._observation_ids(fitted)[0])

        while size() > budget:
            candidates = [
                i for i, m in enumerate(fitted) if i not in cut and isinstance(m.get("content"), str)
            ]
            if not candidates:
                return None
            i = max(candidates, key=lambda j: len(fitted[j]["content"]))
            content_ids = self.encode(fitted[i]["content"])
            cut.add(i)

            def fits(keep: int, i: int = i, content_ids: list[int] = content_ids) -> bool:
                fitted[i]["content"] = self._decode(content_ids[:keep]) + TRUNCATION_MARKER
                return size() <= budget

            if not fits(0):
                continue  # this message alone cannot fit: shorten the next one too
            low, high = 0, len(content_ids)  # fits(low) holds; find the largest such keep
            while low < high:
                middle = (low + high + 1) // 2
                if fits(middle):
                    low = middle
                else:
                    high = middle - 1
            fits(low)
        return fitted

    def _probe_turn(self) -> tuple[str, str]:
        """Find the closure and the generation prompt; check the first turn extends the prompt."""
        at = self._base_text.rfind(_PROBE_ASSISTANT)
        if at < 0:
            raise AgentR1Error(
                "the chat template does not render assistant content verbatim (the probe answer "
                f"{_PROBE_ASSISTANT!r} is missing from {self._base_text!r}); token-faithful rollouts need it"
            )
        closure = self._base_text[at + len(_PROBE_ASSISTANT) :]
        user = self._base[:1]
        closed = self.render_text(user, add_generation_prompt=False)
        prompt = self.render_text(user, add_generation_prompt=True)
        if not prompt.startswith(closed) or len(prompt) == len(closed):
            raise AgentR1Error(
                "the chat template has no generation prompt: add_generation_prompt=True does not append "
                f"a header opening the assistant message (got {prompt[len(closed) :]!r})"
            )
        if self._base_text[:at] != prompt:
            self.template_issues.append(
                "a finished assistant turn is rendered with a different opening than the generation "
                f"prompt ({prompt[len(closed) :]!r} vs {self._base_text[len(closed) : at]!r})"
            )
        return closure, prompt[len(closed) :]

    def _probe_observations(self) -> None:
        for role in ("tool", "user"):
            try:
                self._observation_text([{"role": role, "content": _PROBE_OBSERVATION}])
            except AgentR1Error as exc:
                self.template_issues.append(f"observations with role {role!r} cannot be appended: {exc}")

    def _probe_conversation(self) -> None:
        """Build a realistic conversation incrementally (reasoning, a tool turn, a user turn, with
        and without tool schemas) and compare it with the full render."""
        turns = [
            ("<think>I should look it up.</think>Let me search.", {"role": "tool", "content": "Result: 42."}),
            (
                "<think>The tool says 42.</think>The answer is 42.",
                {"role": "user", "content": "Are you sure?"},
            ),
            ("Yes.", None),
        ]
        for tools in (None, [_PROBE_TOOL]):
            messages: list[Message] = [
                {"role": "system", "content": "You are a probe."},
                {"role": "user", "content": _PROBE_USER},
            ]
            incremental = self.render_text(messages, tools, add_generation_prompt=True)
            try:
                for content, observation in turns:
                    messages.append({"role": "assistant", "content": content})
                    incremental += content + self.closure_text
                    if observation is not None:
                        env_text, header_text = self._observation_text([observation])
                        messages.append(observation)
                        incremental += env_text + header_text
            except AgentR1Error:
                continue  # already reported by _probe_observations
            full = self.render_text(messages, tools, add_generation_prompt=False)
            if full != incremental:
                at = _first_difference(full, incremental)
                label = "with tool schemas" if tools else "without tool schemas"
                self.template_issues.append(
                    f"a multi-turn conversation {label} renders differently in full than built turn by "
                    f"turn, from character {at}: {full[at : at + 50]!r} vs {incremental[at : at + 50]!r}"
                )


def turn_stop_token_ids(
    tokenizer: PreTrainedTokenizerBase, generation_config: Any, extra: Sequence[int], *, backend: str
) -> set[int]:
    """Every token id that ends a turn for a rollout backend: ``extra`` (the backend's configured
    ``stop_token_ids``), the tokenizer's EOS, the model's ``generation_config.eos_token_id`` (one id
    or several) and the chat template's end-of-turn tokens. Raises when there is none."""
    ids: set[int] = {int(i) for i in extra}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured is not None:
        ids.update(int(i) for i in configured)
    ids.update(end_of_turn_token_ids(tokenizer))
    if not ids:
        raise AgentR1Error(
            f"the {backend!r} rollout backend found no token that ends a turn: the tokenizer has no "
            "eos_token, the model's generation_config no eos_token_id and the chat template no "
            "end-of-turn token. Set rollout.backend.stop_token_ids."
        )
    return ids


def end_of_turn_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The special token that the chat template puts right after assistant content (``<|im_end|>``,
    ``<|eot_id|>``...), as a list; empty when there is no template or no such token. Renders with
    the run's ``model.chat_template_kwargs`` recorded on the tokenizer."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    try:
        base = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
        text = str(
            tokenizer.apply_chat_template(
                base, tokenize=False, add_generation_prompt=False, **configured_template_kwargs(tokenizer)
            )
        )
    except Exception:  # no usable template: callers fall back to the EOS token alone
        return []
    at = text.rfind(_PROBE_ASSISTANT)
    if at < 0:
        return []
    closure = tokenizer.encode(text[at + len(_PROBE_ASSISTANT) :], add_special_tokens=False)
    return [closure[0]] if closure and closure[0] in _special_ids(tokenizer) else []


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, token in decoder.items() if getattr(token, "special", False))
    return ids


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _difference(a: list[int], b: list[int]) -> int:
    """Length of the longer of the two remainders after removing the common prefix and suffix."""
    start = 0
    while start < len(a) and start < len(b) and a[start] == b[start]:
        start += 1
    end = 0
    while end < len(a) - start and end < len(b) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    return max(len(a) - start - end, len(b) - start - end)
