"""Chat messages (and tools) to prompt text through the tokenizer's own chat template.

When the template renders `tools=` (Qwen, Llama 3.x, Mistral, Hermes templates do), tools,
assistant tool calls and tool results go to it as transformers expects; when it ignores them
(SmolLM2's does: the prompt is the same with and without tools), the conversation is
rewritten into the generic format of drift.api.tools. A template that raises (roles that
must alternate, ...) is a 400 with the template's message. Knows nothing of generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError

from drift.api.messages import ChatMessage, ToolSpec
from drift.api.tools import generic_messages, native_messages
from drift.wire.errors import BadRequest

_PROBE_TOOL = ToolSpec("drift_probe", "probe", {"type": "object", "properties": {}})


class ChatTemplate:
    def __init__(self, tokenizer: Any, model_id: str) -> None:
        self.tokenizer = tokenizer
        self.model_id = model_id
        self._native_tools: bool | None = None

    @property
    def native_tools(self) -> bool:
        """Whether the template renders `tools=` (checked once by rendering a probe)."""
        if self._native_tools is None:
            probe = [{"role": "user", "content": "x"}]
            try:
                with_tools = self._apply(probe, [_PROBE_TOOL.openai()])
            except BadRequest:
                with_tools = None
            self._native_tools = with_tools is not None and with_tools != self._apply(probe, None)
        return self._native_tools

    def render(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise BadRequest(
                f"model {self.model_id!r} has no chat template; use /v1/completions with a "
                "plain prompt instead",
                param="messages",
            )
        uses_tools = bool(tools) or any(m.tool_calls or m.role == "tool" for m in messages)
        if uses_tools and self.native_tools:
            return self._apply(native_messages(messages), [t.openai() for t in tools] or None)
        return self._apply(generic_messages(messages, tools), None)

    def _apply(self, conversation: list[dict[str, Any]], tools: list[dict] | None) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                conversation, tools=tools, add_generation_prompt=True, tokenize=False
            )
        except TemplateError as exc:
            raise BadRequest(f"the chat template refused the messages: {exc}",
                             param="messages") from exc  # fmt: skip
        return str(text)
