"""Tool calls in the Hermes syntax: the prompt for templates without tools, grammar, parser.

A call is written `<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`, several
separated by "\\n": the syntax of Qwen 2.5/3 and Hermes templates and of SmolLM2's larger
siblings. `generic_messages` rewrites a conversation for a chat template that ignores
`tools=` (SmolLM2's): tools go into the system message (GENERIC_SYSTEM), assistant tool
calls become that text, tool results become user messages in <tool_response> tags.
`calls_rule` is the Lark rule that forces calls; `ToolCallParser` turns generated text into
content and tool-call deltas as it streams. Knows no tokens and no HTTP.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from drift.api.grammar import json_value, quoted
from drift.api.messages import ChatMessage, ToolSpec

OPEN = "<tool_call>\n"
CLOSE = "\n</tool_call>"
SEPARATOR = "\n"
_HEADER = re.compile(r'\{"name": "([A-Za-z0-9_-]+)", "arguments": ')
GENERIC_SYSTEM = (
    "You may call functions to answer. The functions, as JSON schemas, are inside "
    "<tools></tools>:\n<tools>\n{tools}\n</tools>\nTo call functions, reply with only one "
    'JSON object per call, each inside <tool_call></tool_call> tags:\n<tool_call>\n{{"name": '
    '<function-name>, "arguments": <arguments-json-object>}}\n</tool_call>\nFunction results '
    "come back inside <tool_response></tool_response> tags."
)


def call_text(name: str, arguments: str) -> str:
    """One call as the model writes it."""
    return f'{OPEN}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{CLOSE}'


def calls_rule(tools: Sequence[ToolSpec], *, parallel: bool) -> list[str]:
    """Lark rules defining `calls`: one call (or several with `parallel`) of `tools`."""
    rules = [f"calls: call{' (' + quoted(SEPARATOR) + ' call)*' if parallel else ''}"]
    rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
    for i, tool in enumerate(tools):
        head = f'{OPEN}{{"name": {json.dumps(tool.name)}, "arguments": '
        rules.append(f"call_{i}: {quoted(head)} args_{i} {quoted('}' + CLOSE)}")
        rules.append(f"args_{i}: {json_value(tool.parameters)}")
    return rules


def generic_messages(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
) -> list[dict[str, Any]]:
    """The conversation for a template without tool support (see the module docstring)."""
    out: list[dict[str, Any]] = []
    names = {c.id: c.name for m in messages for c in m.tool_calls}
    for msg in messages:
        if msg.role == "tool":
            name = names.get(msg.tool_call_id or "", "")
            body = json.dumps({"name": name, "content": msg.content}, ensure_ascii=False)
            text = f"<tool_response>\n{body}\n</tool_response>"
            if out and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_tool": True})
            continue
        content = msg.content
        if msg.tool_calls:
            calls = SEPARATOR.join(call_text(c.name, c.arguments) for c in msg.tool_calls)
            content = f"{content}\n{calls}" if content else calls
        out.append({"role": "system" if msg.role == "developer" else msg.role, "content": content})
    for m in out:
        m.pop("_tool", None)
    if tools:
        listing = "\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools)
        system = GENERIC_SYSTEM.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{system}"
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def native_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation in transformers' chat-template convention: arguments as dicts (text
    where they are not a JSON object, which templates such as Qwen's write as they are)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        role = "system" if msg.role == "developer" else msg.role
        item: dict[str, Any] = {"role": role, "content": msg.content}
        if msg.tool_calls:
            item["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.parsed_arguments()}}
                for c in msg.tool_calls
            ]  # fmt: skip
        if msg.tool_call_id is not None:
            item["tool_call_id"] = msg.tool_call_id
        out.append(item)
    return out


@dataclass(frozen=True)
class CallDelta:
    """A piece of tool call `index`: its id and name come once, then argument text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


Piece = str | CallDelta  # content text, or part of a tool call


class ToolCallParser:
    """Splits generated text into content and tool calls, releasing what is certain."""

    def __init__(self, *, text_allowed: bool) -> None:
        self.state = "start" if text_allowed else "calls"
        self.buf = ""
        self.pos = 0  # start of the current call in buf
        self.index = -1  # index of the current call (-1: none yet)
        self.args_at: int | None = None  # where the current call's arguments start
        self.sent = 0  # argument characters of the current call released

    def push(self, text: str) -> list[Piece]:
        self.buf += text
        if self.state == "start":
            if OPEN.startswith(self.buf):
                return []
            self.state = "calls" if self.buf.startswith(OPEN) else "text"
            if self.state == "text":
                return [self.buf] if self.buf else []
        elif self.state == "text":
            return [text] if text else []
        return self._calls()

    def finish(self) -> list[Piece]:
        """Generation ended: release what is held (an unfinished call stays unfinished)."""
        if self.state == "start":
            self.state = "text"
            return [self.buf] if self.buf else []
        if self.state == "calls" and self.args_at is not None:
            rest = self.buf[self.args_at + self.sent :]
            self.sent += len(rest)
            return [CallDelta(self.index, rest)] if rest else []
        return []

    def _calls(self) -> list[Piece]:
        out: list[Piece] = []
        while True:
            if self.args_at is None:
                head = self.buf[self.pos :]
                if head.startswith(SEPARATOR + OPEN):
                    head, self.pos = head[len(SEPARATOR) :], self.pos + len(SEPARATOR)
                match = _HEADER.match(head, len(OPEN)) if head.startswith(OPEN) else None
                if match is None:
                    return out
                self.index += 1
                self.args_at, self.sent = self.pos + match.end(), 0
                call_id = "call_" + secrets.token_hex(12)
                out.append(CallDelta(self.index, "", call_id, match.group(1)))
            args = self.buf[self.args_at :]
            end = _complete(args)
            if end is None:  # release all but what may be the call's closing
                upto = max(self.sent, len(args) - len("}" + CLOSE))
                if upto > self.sent:
                    out.append(CallDelta(self.index, args[self.sent : upto]))
                    self.sent = upto
                return out
            if end > self.sent:
                out.append(CallDelta(self.index, args[self.sent : end]))
            self.pos = self.args_at + end + len("}" + CLOSE)
            self.args_at = None


def _complete(args: str) -> int | None:
    """Length of the arguments JSON when `args` holds it and the call's closing."""
    try:
        _, end = json.JSONDecoder().raw_decode(args)
    except json.JSONDecodeError:
        return None
    return end if args[end:].startswith("}" + CLOSE) else None
