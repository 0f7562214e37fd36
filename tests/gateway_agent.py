"""Agent programs for the gateway tests, written the way users write them: with the official
``openai`` client, which reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` from the environment
(the gateway's launcher sets them). Run as ``python gateway_agent.py MODE``; the task comes as JSON
on stdin, the final answer goes to the last line of stdout.

Modes:

* ``react``: a ReAct loop with a calculator tool implemented here. Tool calls the model makes are
  run and their results sent back as ``tool`` messages; when the model answers without a call on
  the first turn, the agent asks it to use the calculator (a ``user`` message), so that every
  episode has several calls whatever a tiny model writes.
* ``rewrite``: two calls, then a *rewritten* history (a summary instead of the earlier turns) and
  two more calls.
* ``toy``: two calls (the second after "Once more."), sampling at temperature 0.7; the answer is
  the last reply (the training tests' agent).
* ``crash``: one call, then an exception. ``hang``: one call, then sleeps forever with a child
  process. ``silent``: no call at all. ``flaky``: ``toy``, but crashes on the task whose id is in
  the ``CRASH_ON`` environment variable.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import subprocess
import sys
import time
from typing import Any

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
SYSTEM = "You are a helpful assistant."
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    """The agent's own calculator tool (numbers and + - * / only)."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"cannot evaluate {expression!r}")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"Error: {exc}"
    return str(int(result)) if float(result).is_integer() else str(result)


def react(client: Any, model: str, task: dict) -> str:
    messages: list = [{"role": "system", "content": SYSTEM}, *task["messages"]]
    content = ""
    for turn in range(3):
        response = client.chat.completions.create(
            model=model, messages=messages, tools=[CALCULATOR], temperature=0, max_tokens=40
        )
        message = response.choices[0].message
        content = message.content or ""
        messages.append(message)  # the SDK's own message object, as agents usually keep it
        if message.tool_calls:
            for call in message.tool_calls:
                arguments = json.loads(call.function.arguments)
                result = calculate(str(arguments.get("expression", "")))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            print(f"turn {turn}: tool calls {[c.function.name for c in message.tool_calls]}", file=sys.stderr)
        elif turn == 0:
            messages.append({"role": "user", "content": "Use the calculator tool."})
        else:
            break
    return content


def rewrite(client: Any, model: str, task: dict) -> str:
    messages: list = [{"role": "system", "content": SYSTEM}, *task["messages"]]
    for _ in range(2):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
        messages += [reply.choices[0].message, {"role": "user", "content": "Go on."}]
    # The agent compacts its memory: the earlier turns are replaced by a summary.
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Summary: we talked."}]
    content = ""
    for _ in range(2):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
        content = reply.choices[0].message.content or ""
        messages += [reply.choices[0].message, {"role": "user", "content": "Go on."}]
    return content


def toy(client: Any, model: str, task: dict) -> str:
    messages: list = list(task["messages"])
    reply = client.chat.completions.create(model=model, messages=messages, temperature=0.7, max_tokens=6)
    messages += [reply.choices[0].message, {"role": "user", "content": "Once more."}]
    reply = client.chat.completions.create(model=model, messages=messages, temperature=0.7, max_tokens=6)
    return reply.choices[0].message.content or ""


def main(mode: str) -> None:
    if mode == "hang":  # a child process first: the launcher must kill it with the agent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"child {child.pid}", file=sys.stderr, flush=True)
    import openai  # after the child above: a slow import must not delay it

    task = json.loads(sys.stdin.read())
    assert task == json.loads(os.environ["AGENT_R1_TASK"])
    client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = os.environ["AGENT_R1_MODEL"]
    if mode == "silent":
        print("no model call")
        return
    if mode in ("crash", "hang"):
        client.chat.completions.create(model=model, messages=task["messages"], max_tokens=2)
        if mode == "crash":
            raise RuntimeError("the agent program broke")
        time.sleep(600)
    if mode == "flaky" and task["id"] == os.environ.get("CRASH_ON"):
        client.chat.completions.create(model=model, messages=task["messages"], max_tokens=2)
        raise RuntimeError(f"the agent program broke on task {task['id']}")
    answer = {"react": react, "rewrite": rewrite, "toy": toy, "flaky": toy}[mode](client, model, task)
    print(json.dumps({"answer": answer}))


if __name__ == "__main__":
    main(sys.argv[1])
