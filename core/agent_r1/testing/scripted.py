"""A scripted policy for testing environments, tools and reward shapers without a trained model.

:class:`ScriptedBackend` is a :class:`~agent_r1.RolloutBackend` that *says what you scripted*: it
replays given texts as actions, tokenised by the real tokenizer, with the same stopping rules as
a real backend (stop strings, end-of-turn token, token budgets). It is a legitimate fake for
"what the model says": everything downstream (the rollout engine, the chat template, the
environment, its tools, the rewards) runs for real. A tiny random model would almost never write
a well-formed tool call; a script does, and can also write the malformed ones you want to test.

Example::

    from agent_r1.rollout.loop import RolloutEngine
    from agent_r1.testing.scripted import ScriptedBackend

    backend = ScriptedBackend(tokenizer=tokenizer, responses=["<calc>2+3</calc>", "<answer>5</answer>"])
    engine = RolloutEngine(backend, tokenizer, lambda: CalculatorEnv(), max_turns=4)
    [trajectory] = engine.collect([task], group_size=1, seed=0)

The scripted policy is deterministic, so every sampled token has log-probability 0.0 (probability
1), which is what :class:`~agent_r1.contracts.Generation` carries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agent_r1.contracts import ComponentConfig, Generation, RolloutBackend, SamplingParams

__all__ = ["ScriptedBackend", "scripted_rollout"]

Script = Sequence[str] | Callable[[str], str]
"""Either one text per backend call (the engine makes one call per turn, so: one text per turn,
given to every episode), or a function of the decoded prompt returning the text to say."""


class ScriptedBackend(RolloutBackend):
    """Replays scripted texts as actions through the real tokenizer.

    For each prompt the text is ``responses[call_index]`` or ``responses(prompt_text)``. It is cut
    right after the first stop string of ``sampling.stop`` it contains (finish reason ``stop``);
    otherwise the end-of-turn token (``<|im_end|>``, or the tokenizer's EOS) is appended (finish
    reason ``eos``); a result longer than the row's token budget is cut to it (``length``). All
    prompts received are kept in :attr:`prompts`, one list per call.
    """

    name = "scripted"

    def __init__(
        self,
        config: ComponentConfig | dict[str, Any] | None = None,
        *,
        tokenizer: Any,
        responses: Script,
        **resources: Any,
    ) -> None:
        super().__init__(config, tokenizer=tokenizer, **resources)
        from agent_r1.rollout.chat import end_of_turn_token_ids

        self.tokenizer = tokenizer
        self.responses = responses
        end_of_turn = end_of_turn_token_ids(tokenizer)
        self.eos_token_id: int = end_of_turn[0] if end_of_turn else int(tokenizer.eos_token_id)
        self.prompts: list[list[list[int]]] = []

    def _generate_within(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, budgets: list[int]
    ) -> list[Generation]:
        """One scripted continuation per prompt (see the class docstring for the rules)."""
        call = len(self.prompts)
        self.prompts.append([list(p) for p in prompts])
        return [
            self._say(self._text(call, prompt), sampling.stop, budget)
            for prompt, budget in zip(prompts, budgets, strict=True)
        ]

    def _text(self, call: int, prompt: Sequence[int]) -> str:
        if callable(self.responses):
            return self.responses(self.tokenizer.decode(list(prompt), skip_special_tokens=False))
        if call >= len(self.responses):
            raise IndexError(
                f"ScriptedBackend was called {call + 1} times but the script has {len(self.responses)} "
                "responses; add responses or lower max_turns"
            )
        return self.responses[call]

    def _say(self, text: str, stops: Sequence[str], budget: int) -> Generation:
        hits = [(text.find(stop) + len(stop), stop) for stop in stops if stop and stop in text]
        if hits:
            end, stop = min(hits)
            ids = self.tokenizer.encode(text[:end], add_special_tokens=False)
            finish, stop_sequence = "stop", stop
        else:
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.eos_token_id]
            finish, stop_sequence = "eos", None
        if len(ids) > budget:
            ids, finish, stop_sequence = ids[:budget], "length", None
        return Generation(
            token_ids=list(ids),
            logprobs=[0.0] * len(ids),
            finish_reason=finish,  # type: ignore[arg-type]
            stop_sequence=stop_sequence,
        )


def scripted_rollout(
    environment: Any,
    responses: Script,
    tasks: Any,
    *,
    tokenizer: Any = None,
    max_turns: int = 4,
    max_new_tokens: int = 256,
    max_context: int = 4096,
    seed: int = 0,
) -> list[Any]:
    """Roll out ``tasks`` (a :class:`~agent_r1.mdp.Task` or a list) once each through the real
    rollout engine, with the policy saying ``responses`` (see :data:`Script`); returns the
    trajectories. ``environment`` is an environment instance, class or factory (called once per
    episode); ``tokenizer`` defaults to the tiny test tokenizer. One import for a plugin test::

        from agent_r1.testing import scripted_rollout

        [trajectory] = scripted_rollout(MyEnv, ["<calc>2+3</calc>", "<answer>5</answer>"], task)
        assert trajectory.steps[-1].action.answer == "5"
    """
    from agent_r1.contracts import Environment
    from agent_r1.mdp import Task
    from agent_r1.rollout.loop import RolloutEngine

    if tokenizer is None:
        from agent_r1.testing.models import tiny_tokenizer

        tokenizer = tiny_tokenizer()
    if isinstance(environment, Environment):
        instance = environment
        factory: Callable[[], Any] = lambda: instance  # noqa: E731
    else:
        factory = environment
    engine = RolloutEngine(
        ScriptedBackend(tokenizer=tokenizer, responses=responses),
        tokenizer,
        factory,
        max_turns=max_turns,
        max_new_tokens=max_new_tokens,
        max_context=max_context,
    )
    batch = [tasks] if isinstance(tasks, Task) else list(tasks)
    return engine.collect(batch, 1, seed=seed)
