"""A calculator agent written with the official OpenAI client, as you would write it for any
OpenAI-compatible API, and trained by agent-r1 through its policy gateway (docs/gateway.md).

Nothing here knows about agent-r1: the client reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``
from the environment, the model name comes from ``AGENT_R1_MODEL`` (or ``--model``-style
defaults of your own), the task is a dict with the chat ``messages``.

* As ``rollout.agent.callable: calculator_agent:solve``, agent-r1 calls ``solve(task)`` once per
  episode in a fresh process and takes its return value as the final answer.
* As a program (``rollout.agent.command: [python, calculator_agent.py]``) it reads the task as JSON
  on stdin and prints the answer as the last line of stdout.

The agent is a small ReAct loop: the model may call the ``calculator`` tool (run here, in the
agent), sees the result, and gives the final answer inside ``<answer></answer>``. Two worked
examples go first, as earlier turns of the conversation.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import re
import sys
from fractions import Fraction
from typing import Any

from openai import OpenAI

SYSTEM = "Solve the math problem. Use the calculator for every calculation."
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / ( ) and return the number.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 12*(3+4)"}},
            "required": ["expression"],
        },
    },
}
EXAMPLES = (
    ("A crate holds 23 jars. How many jars are in 41 crates?", "23*41"),
    ("A shop had 512 apples and sold 178. How many apples are left?", "512-178"),
)
MAX_TURNS = 3
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def calculate(expression: str) -> str:
    """The tool: exact arithmetic on + - * / and parentheses; integers stay integers."""

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return Fraction(str(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("use only numbers, + - * / and parentheses")

    try:
        result = value(ast.parse(expression.strip().rstrip("="), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"Error: {exc}"
    return str(result.numerator) if result.denominator == 1 else f"{float(result):.6g}"


def worked_examples() -> list[dict[str, Any]]:
    """The examples as conversation turns: question, tool call, tool result, answer."""
    messages: list[dict[str, Any]] = []
    for index, (question, expression) in enumerate(EXAMPLES):
        call_id = f"example_{index}"
        arguments = json.dumps({"expression": expression})
        messages += [
            {"role": "user", "content": question},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "calculator", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": calculate(expression)},
            {"role": "assistant", "content": f"<answer>{calculate(expression)}</answer>"},
        ]
    return messages


def solve(task: dict[str, Any]) -> str:
    """Run the ReAct loop on one task; returns the final answer ('' when none was given)."""
    client = OpenAI()
    model = os.environ.get("AGENT_R1_MODEL", "smollm2-135m-instruct")
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, *worked_examples(), *task["messages"]]
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(
            model=model, messages=messages, tools=[CALCULATOR], max_tokens=32
        )
        message = reply.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            text = message.content or ""
            found = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
            return found.group(1).strip() if found else text.strip()
        for call in message.tool_calls:
            try:
                expression = str(json.loads(call.function.arguments).get("expression", ""))
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    return ""


if __name__ == "__main__":
    print(json.dumps({"answer": solve(json.load(sys.stdin))}))
