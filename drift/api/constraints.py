"""What a request forces the model to write, as one Lark grammar (or None: no constraint).

`response_format` json_object / json_schema constrains the answer to one JSON value; tools
with tool_choice `required` or a named function force tool calls; `auto` allows free text
(or the JSON answer) or calls, the text never starting like a call. Pure text building:
drift.api.grammar compiles it, drift.api.tools owns the call syntax.
"""

from __future__ import annotations

from collections.abc import Sequence

from drift.api.grammar import json_value
from drift.api.messages import ToolChoice, ToolSpec
from drift.api.protocol import ResponseFormat
from drift.api.tools import OPEN, calls_rule

# Any non-empty text that does not start like a tool call.
NO_TOOLS = ToolChoice("none")
TEXT_RULE = f"TEXT: /(?s:.+)/ & ~/(?s:{OPEN.strip()}.*)/"


def answer_value(response_format: ResponseFormat) -> str | None:
    if response_format.kind == "json_object":
        return json_value({"type": "object"})
    if response_format.kind == "json_schema":
        return json_value(response_format.schema or {})
    return None


def request_grammar(
    response_format: ResponseFormat,
    tools: Sequence[ToolSpec] = (),
    choice: ToolChoice = NO_TOOLS,
    *,
    parallel: bool = True,
) -> str | None:
    value = answer_value(response_format)
    if choice.mode == "none" or not tools:
        return None if value is None else f"start: {value}"
    if choice.mode == "function":
        tools = [t for t in tools if t.name == choice.name]
    rules = calls_rule(tools, parallel=parallel)
    if choice.mode != "auto":
        return "\n".join(["start: calls", *rules])
    answer = (
        ["start: answer | calls", f"answer: {value}"]
        if value
        else ["start: TEXT | calls", TEXT_RULE]
    )
    return "\n".join([*answer, *rules])
