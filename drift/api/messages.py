"""Chat messages, tool definitions and tool choice of an OpenAI request, as frozen types.

`parse_messages`, `parse_tools` and `parse_tool_choice` validate the JSON once and raise
`BadRequest` naming the field: unknown roles, tool calls without a name, id or string
arguments (any text: a call cut off by max_tokens comes back unfinished), tool messages
without `tool_call_id`, a named tool_choice that is not in `tools`.
Knows nothing of templates or tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from drift.wire.errors import BadRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # as OpenAI sends it: JSON text of an object, or what a cut-off call wrote

    def parsed_arguments(self) -> dict[str, Any] | str:
        """The arguments as a dict when they are a JSON object, else the text as it is."""
        try:
            value = json.loads(self.arguments)
        except json.JSONDecodeError:
            return self.arguments
        return value if isinstance(value, dict) else self.arguments


@dataclass(frozen=True)
class ChatMessage:
    role: str  # one of ROLES
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # assistant messages only
    tool_call_id: str | None = None  # tool messages only


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object

    def openai(self) -> dict[str, Any]:
        """The tool as OpenAI (and chat templates) spell it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # "none" | "auto" | "required" | "function"
    name: str | None = None  # the forced function when mode == "function"


MAX_SCHEMA_DEPTH = 64  # nesting levels (objects and arrays) a JSON schema may have


def check_schema_depth(schema: Any, param: str) -> None:
    """BadRequest naming the limit when `schema` nests deeper than MAX_SCHEMA_DEPTH (counted
    without recursion: a schema nested thousands deep is refused, not a RecursionError)."""
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise _bad(param, f"the JSON schema nests deeper than the limit of "
                              f"{MAX_SCHEMA_DEPTH} levels (MAX_SCHEMA_DEPTH)")  # fmt: skip
        children = value.values() if isinstance(value, dict) else value if isinstance(
            value, list) else ()  # fmt: skip
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def _bad(param: str, message: str) -> BadRequest:
    return BadRequest(message, param=param)


def _content(where: str, content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise _bad(where, "only text content parts are supported")
            if not isinstance(part.get("text"), str):
                raise _bad(where, "a text part needs a string 'text'")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(where, "'content' must be a string or a list of parts")


def _tool_call(where: str, call: Any) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type", "function") != "function":
        raise _bad(where, "a tool call needs 'type': 'function' and a 'function' object")
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.function.name", "a tool call needs a function 'name'")
    if not isinstance(arguments, str):
        raise _bad(f"{where}.function.arguments", "'arguments' must be a string of JSON")
    # not parsed: a call the model cut off (finish_reason "length") comes back in the history
    # as it was answered, arguments unfinished, and OpenAI takes it so
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.id", "a tool call needs a string 'id'")
    return ToolCall(call_id, name, arguments)


def _message(i: int, msg: Any) -> ChatMessage:
    where = f"messages[{i}]"
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
        raise _bad(where, "each message needs a string 'role'")
    role = msg["role"]
    if role not in ROLES:
        raise _bad(f"{where}.role", f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    content = _content(f"{where}.content", msg.get("content"))
    calls: tuple[ToolCall, ...] = ()
    if msg.get("tool_calls") is not None:
        raw = msg["tool_calls"]
        if role != "assistant" or not isinstance(raw, list):
            raise _bad(f"{where}.tool_calls", "'tool_calls' is a list, on assistant messages")
        calls = tuple(_tool_call(f"{where}.tool_calls[{k}]", c) for k, c in enumerate(raw))
    call_id = msg.get("tool_call_id")
    if role == "tool" and (not isinstance(call_id, str) or not call_id):
        raise _bad(f"{where}.tool_call_id", "a tool message needs the 'tool_call_id' it answers")
    return ChatMessage(role, content, calls, call_id if role == "tool" else None)


def parse_messages(value: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise _bad("messages", "'messages' must be a non-empty list")
    return tuple(_message(i, m) for i, m in enumerate(value))


def parse_tools(value: Any) -> tuple[ToolSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _bad("tools", "'tools' must be a list of {'type': 'function', 'function': {...}}")
    tools, seen = [], set()
    for k, tool in enumerate(value):
        where = f"tools[{k}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            raise _bad(where, "only {'type': 'function', 'function': {...}} tools are supported")
        name = function.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise _bad(f"{where}.function.name", "a function name is 1-64 of a-z, A-Z, 0-9, _, -")
        if name in seen:
            raise _bad(f"{where}.function.name", f"two tools are named {name!r}")
        seen.add(name)
        description = function.get("description") or ""
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(description, str) or not isinstance(parameters, dict):
            raise _bad(where, "'description' must be a string and 'parameters' a JSON schema")
        check_schema_depth(parameters, f"{where}.function.parameters")
        tools.append(ToolSpec(name, description, parameters))
    return tuple(tools)


def parse_tool_choice(value: Any, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if value in ("none", "auto", "required"):
        choice = ToolChoice(value)
    elif isinstance(value, dict) and isinstance(value.get("function"), dict):
        choice = ToolChoice("function", value["function"].get("name"))
    else:
        raise _bad("tool_choice", "'tool_choice' is 'none', 'auto', 'required' or "
                   "{'type': 'function', 'function': {'name': ...}}")  # fmt: skip
    if choice.mode in ("required", "function") and not tools:
        raise _bad("tool_choice", f"tool_choice {value!r} needs 'tools'")
    if choice.mode == "function" and choice.name not in {t.name for t in tools}:
        raise _bad("tool_choice", f"tool_choice names {choice.name!r}, which is not in 'tools'")
    return choice
