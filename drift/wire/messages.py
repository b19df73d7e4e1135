"""Typed wire messages: frozen dataclasses, validated once at the edge, then trusted.

Tensor-bearing messages convert with `from_wire(params, tensors, ...)` / `to_wire() ->
(params, tensors)` (a frame: see frames.py); JSON-only ones with `from_wire(obj)` /
`to_wire() -> dict`. /forward and /backward also have plain-JSON forms (nested lists).
Knows nothing about sockets or models.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from drift.wire import checks as c
from drift.wire import fields as f
from drift.wire.codec import decode, encode  # noqa: F401  (re-exported: frame bytes)
from drift.wire.errors import BadRequest, BadTensor
from drift.wire.extras import BLOCK_STATES, GRAD_PREFIX, NO_EXTRAS, ExtraSpec, grad_name
from drift.wire.lora import adapter_param
from drift.wire.step import StepRequest, StepResponse  # noqa: F401  (re-exported)
from drift.wire.version import PROTOCOL_VERSION

Tensors = dict[str, torch.Tensor]
SpecFor = Callable[[int, int], ExtraSpec]  # (start_block, end_block) -> what that span takes


@dataclass(frozen=True)
class ForwardRequest:
    """Stateless hidden states through [start_block, end_block) of `model`."""

    model: str  # the model fingerprint
    start_block: int
    end_block: int
    hidden_states: torch.Tensor  # [B, T, H]
    attention_mask: torch.Tensor | None = None  # [B, T] 1 = token, 0 = left padding
    prompts: torch.Tensor | None = None  # [n_blocks, B, P, H] deep prompts
    extras: Tensors = field(default_factory=dict)  # per-layer inputs, consumed K/V (extras.py)
    donate: tuple[int, ...] = ()  # blocks whose shared K/V the reply must carry
    block_states: bool = False  # the reply carries each block's output (extras.BLOCK_STATES)
    adapter: str | None = None  # a LoRA adapter the server holds, by name (wire.lora)

    TENSORS = ("hidden_states", "attention_mask", "prompts")

    @classmethod
    def from_wire(
        cls, params: dict[str, Any], tensors: Tensors, *, hidden_size: int | None = None,
        extras: SpecFor | None = None,
    ) -> ForwardRequest:  # fmt: skip
        """`extras` gives what a span takes beside hidden_states (the server's model)."""
        c.check_version(params)
        start, end = c.get_span(params)
        spec = extras(start, end) if extras is not None else NO_EXTRAS
        c.no_extra_tensors(tensors, cls.TENSORS + spec.input_names())
        own, named = f.split(tensors, cls.TENSORS)
        inputs = c.check_pass(c.tensor(own, "hidden_states"), own.get("attention_mask"),
                              own.get("prompts"), hidden_size=hidden_size, n_blocks=end - start,
                              extras=named, spec=spec)  # fmt: skip
        return cls(
            model=c.get_str(params, "model"),
            start_block=start,
            end_block=end,
            hidden_states=inputs.hidden,
            attention_mask=inputs.attention_mask,
            prompts=inputs.prompts,
            extras=inputs.extras,
            donate=c.get_donate(params, spec),
            block_states=c.get_flag(params, BLOCK_STATES),
            adapter=c.get_adapter(params),
        )

    def to_wire(self) -> tuple[dict[str, Any], Tensors]:
        params = f.head("forward", model=self.model, start_block=self.start_block,
                       end_block=self.end_block, **adapter_param(self.adapter))  # fmt: skip
        return f.with_donate(params, self.donate, self.block_states), f.present(
            hidden_states=self.hidden_states,
            attention_mask=self.attention_mask,
            prompts=self.prompts,
            **self.extras,
        )

    @classmethod
    def from_json(
        cls, obj: Any, *, default_model: str, hidden_size: int | None = None,
        extras: SpecFor | None = None,
    ) -> ForwardRequest:  # fmt: skip
        params, tensors = _json_parts(obj, default_model, cls.TENSORS, "hidden_states")
        return cls.from_wire(params, tensors, hidden_size=hidden_size, extras=extras)


@dataclass(frozen=True)
class BackwardRequest:
    """Gradients w.r.t. the inputs (and deep prompts) of a span; the forward is recomputed."""

    model: str
    start_block: int
    end_block: int
    hidden_states: torch.Tensor  # [B, T, H]
    grad_outputs: torch.Tensor  # [B, T, H] gradient w.r.t. the span's output
    attention_mask: torch.Tensor | None = None  # [B, T]
    prompts: torch.Tensor | None = None  # [n_blocks, B, P, H]
    extras: Tensors = field(default_factory=dict)  # per-layer inputs, consumed K/V (extras.py)
    grad_extras: Tensors = field(default_factory=dict)  # grads w.r.t. donated K/V, by K/V name
    adapter: str | None = None  # a LoRA adapter the server holds, by name (wire.lora)

    TENSORS = ("hidden_states", "grad_outputs", "attention_mask", "prompts")

    @classmethod
    def from_wire(
        cls, params: dict[str, Any], tensors: Tensors, *, hidden_size: int | None = None,
        extras: SpecFor | None = None,
    ) -> BackwardRequest:  # fmt: skip
        grads = {k: v for k, v in tensors.items() if k.startswith(GRAD_PREFIX)}
        fwd = ForwardRequest.from_wire(
            params, {k: v for k, v in tensors.items() if k != "grad_outputs" and k not in grads},
            hidden_size=hidden_size, extras=extras,
        )  # fmt: skip
        grad = c.check_grad_outputs(c.tensor(tensors, "grad_outputs"), fwd.hidden_states)
        spec = extras(fwd.start_block, fwd.end_block) if extras is not None else NO_EXTRAS
        donatable = dict(spec.outputs(tuple(block for block, _ in spec.donors)))
        unknown = sorted(k for k in grads if k.removeprefix(GRAD_PREFIX) not in donatable)
        if unknown:
            raise BadTensor(f"unexpected tensors {unknown}: this span's blocks share the keys/"
                            f"values {sorted(donatable)} with later blocks")  # fmt: skip
        named = c.check_named(
            {k.removeprefix(GRAD_PREFIX): v for k, v in grads.items()},
            tuple((k, donatable[k]) for k in sorted(donatable) if grad_name(k) in grads),
            batch=grad.shape[0], tokens=grad.shape[1],
        )  # fmt: skip
        return cls(
            model=fwd.model,
            start_block=fwd.start_block,
            end_block=fwd.end_block,
            hidden_states=fwd.hidden_states,
            grad_outputs=grad,
            attention_mask=fwd.attention_mask,
            prompts=fwd.prompts,
            extras=fwd.extras,
            grad_extras=named,
            adapter=fwd.adapter,
        )

    def to_wire(self) -> tuple[dict[str, Any], Tensors]:
        params = f.head("backward", model=self.model, start_block=self.start_block,
                       end_block=self.end_block, **adapter_param(self.adapter))  # fmt: skip
        return params, f.present(
            hidden_states=self.hidden_states,
            grad_outputs=self.grad_outputs,
            attention_mask=self.attention_mask,
            prompts=self.prompts,
            **self.extras,
            **{grad_name(k): v for k, v in self.grad_extras.items()},
        )

    @classmethod
    def from_json(
        cls, obj: Any, *, default_model: str, hidden_size: int | None = None,
        extras: SpecFor | None = None,
    ) -> BackwardRequest:  # fmt: skip
        params, tensors = _json_parts(obj, default_model, cls.TENSORS, "hidden_states")
        if "grad_outputs" not in tensors:
            raise BadRequest("missing field 'grad_outputs'")
        return cls.from_wire(params, tensors, hidden_size=hidden_size, extras=extras)


@dataclass(frozen=True)
class ForwardResponse:
    hidden_states: torch.Tensor  # [B, T, H]
    extras: Tensors = field(default_factory=dict)  # the donated K/V asked for, by name

    @classmethod
    def from_wire(
        cls, params: dict[str, Any], tensors: Tensors, *, donate: tuple[int, ...] = (),
        states: int = 0,
    ) -> ForwardResponse:  # fmt: skip
        """`donate`: the blocks whose K/V the request asked back (exactly those come);
        `states`: how many blocks' outputs it asked for (0: not asked)."""
        c.check_version(params)
        own, named = f.split(tensors, ("hidden_states",))
        hidden = c.check_activation("hidden_states", c.tensor(own, "hidden_states"), rank=3,
                                    hidden_size=None)  # fmt: skip
        return cls(hidden, f.reply_extras(named, f.donated_names(donate), hidden, states))

    def to_wire(self) -> tuple[dict[str, Any], Tensors]:
        return f.head("forward_result"), {"hidden_states": self.hidden_states, **self.extras}

    def to_json(self) -> dict[str, Any]:
        out = {"hidden_states": f.nested(self.hidden_states)}
        if BLOCK_STATES in self.extras:
            out[BLOCK_STATES] = f.nested(self.extras[BLOCK_STATES])
        return out


@dataclass(frozen=True)
class BackwardResponse:
    grad_inputs: torch.Tensor  # [B, T, H]
    grad_prompts: torch.Tensor | None = None  # [n_blocks, B, P, H]
    grad_extras: Tensors = field(default_factory=dict)  # grads w.r.t. the request's extras

    @classmethod
    def from_wire(
        cls, params: dict[str, Any], tensors: Tensors, *, extras: tuple[str, ...] = ()
    ) -> BackwardResponse:
        """`extras`: the names of the request's extras (a gradient comes for each)."""
        c.check_version(params)
        own, named = f.split(tensors, ("grad_inputs", "grad_prompts"))
        grad = c.check_activation("grad_inputs", c.tensor(own, "grad_inputs"), rank=3,
                                  hidden_size=None)  # fmt: skip
        prompts = own.get("grad_prompts")
        if prompts is not None:
            prompts = c.check_activation("grad_prompts", prompts, rank=4, hidden_size=None)
        grads = f.reply_extras(named, tuple(grad_name(n) for n in extras), grad)
        return cls(grad, prompts, {k.removeprefix(GRAD_PREFIX): v for k, v in grads.items()})

    def to_wire(self) -> tuple[dict[str, Any], Tensors]:
        return f.head("backward_result"), f.present(
            grad_inputs=self.grad_inputs, grad_prompts=self.grad_prompts,
            **{grad_name(k): v for k, v in self.grad_extras.items()},
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {"grad_inputs": f.nested(self.grad_inputs),
                "grad_prompts": f.nested(self.grad_prompts)}  # fmt: skip


@dataclass(frozen=True)
class OpenSession:
    """First message of an inference WebSocket: reserve a KV cache for a (sub-)span."""

    model: str
    start_block: int
    end_block: int
    max_length: int  # tokens, prompt included
    batch_size: int
    dtype: str  # activation dtype: float32 | float16 | bfloat16
    adapter: str | None = None  # a LoRA adapter the server holds, by name (wire.lora)
    # start every row with the first `fork_tokens` tokens of this client's one-row session
    # `fork_of` on this server (a shared prompt prefix, computed once); SessionOpened.holds
    # says whether it did (a server that predates forks opens the session empty)
    fork_of: str | None = None
    fork_tokens: int = 0
    # the session's id and push token, chosen by the client (SESSION_ID_HEX, PUSH_TOKEN_HEX
    # hex digits), so it can send the first step, naming later spans' sessions as next hops,
    # before their `session_opened` replies come; None: the server chooses (a server that
    # predates this ignores them and says its own in SessionOpened)
    session_id: str | None = None
    push_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_wire(cls, obj: Any) -> OpenSession:
        obj = c.typed_object(obj, "open")
        start, end = c.get_span(obj)
        dtype = c.get_str(obj, "dtype")
        if dtype not in c.ACTIVATION_DTYPES:
            raise BadRequest(f"dtype {dtype!r} is not one of {list(c.ACTIVATION_DTYPES)}")
        return cls(
            model=c.get_str(obj, "model"),
            start_block=start,
            end_block=end,
            max_length=c.get_int(obj, "max_length", low=1),
            batch_size=c.get_int(obj, "batch_size", low=1),
            dtype=dtype,
            adapter=c.get_adapter(obj),
            fork_of=c.get_str(obj, "fork_of") if "fork_of" in obj else None,
            fork_tokens=c.get_int(obj, "fork_tokens", low=1) if "fork_of" in obj else 0,
            session_id=(c.get_hex(obj, "session_id", SESSION_ID_HEX)
                        if "session_id" in obj else None),
            push_token=(c.get_hex(obj, "push_token", PUSH_TOKEN_HEX)
                        if "push_token" in obj else None),
        )  # fmt: skip

    def to_wire(self) -> dict[str, Any]:
        fork = {} if self.fork_of is None else {"fork_of": self.fork_of,
                                                "fork_tokens": self.fork_tokens}  # fmt: skip
        ids = {k: v for k, v in (("session_id", self.session_id),
                                 ("push_token", self.push_token)) if v is not None}  # fmt: skip
        return f.head("open", model=self.model, start_block=self.start_block,
                     end_block=self.end_block, max_length=self.max_length,
                     batch_size=self.batch_size, dtype=self.dtype,
                     **adapter_param(self.adapter), **fork, **ids)  # fmt: skip


SESSION_ID_HEX = 16  # hex digits of a session id (64 random bits)
PUSH_TOKEN_HEX = 32  # hex digits of a push token (128 random bits)


def new_session_ids() -> tuple[str, str]:
    """A fresh (session id, push token) pair, random, as a server or a client chooses them."""
    return secrets.token_hex(SESSION_ID_HEX // 2), secrets.token_hex(PUSH_TOKEN_HEX // 2)


@dataclass(frozen=True)
class SessionOpened:
    session_id: str
    max_length: int
    # the secret a step pushed into this session must carry (drift.wire.push); None from a
    # server that predates it (nobody pushes to such a session)
    push_token: str | None = field(default=None, repr=False)
    holds: int = 0  # tokens the session starts with (OpenSession.fork_tokens, when forked)
    # the server takes `idle` (IdleSession); False from one that predates it (nobody sends it)
    idles: bool = False

    @classmethod
    def from_wire(cls, obj: Any) -> SessionOpened:
        obj = c.typed_object(obj, "session_opened")
        token = c.get_str(obj, "push_token") if "push_token" in obj else None
        holds = c.get_int(obj, "holds") if "holds" in obj else 0
        idles = c.get_flag(obj, "idles")
        return cls(c.get_str(obj, "session_id"), c.get_int(obj, "max_length", low=1), token,
                   holds, idles)  # fmt: skip

    def to_wire(self) -> dict[str, Any]:
        out = f.head("session_opened", session_id=self.session_id, max_length=self.max_length)
        if self.push_token is not None:
            out["push_token"] = self.push_token
        if self.holds:
            out["holds"] = self.holds
        if self.idles:
            out["idles"] = True
        return out


@dataclass(frozen=True)
class CloseSession:
    """Optional polite close; closing the socket does the same."""

    @classmethod
    def from_wire(cls, obj: Any) -> CloseSession:
        c.typed_object(obj, "close")
        return cls()

    def to_wire(self) -> dict[str, Any]:
        return f.head("close")


@dataclass(frozen=True)
class IdleSession:
    """The session takes no step for now (held for a later turn): the server's batcher stops
    waiting for its steps, until its next step. No reply. Send it only where SessionOpened
    said `idles` (an older server answers an unknown message with an error)."""

    @classmethod
    def from_wire(cls, obj: Any) -> IdleSession:
        c.typed_object(obj, "idle")
        return cls()

    def to_wire(self) -> dict[str, Any]:
        return f.head("idle")


@dataclass(frozen=True)
class ErrorMessage:
    """An error on a WebSocket (HTTP routes answer `{"error": {...}}` instead)."""

    code: str
    message: str
    step_id: int | None = None  # the step that failed, when one did

    @classmethod
    def from_wire(cls, obj: Any) -> ErrorMessage:
        obj = c.typed_object(obj, "error", versioned=False)
        step_id = obj.get("step_id")
        if step_id is not None:
            step_id = c.get_int(obj, "step_id")
        message = obj.get("message")
        return cls(c.get_str(obj, "code"), message if isinstance(message, str) else "", step_id)

    def to_wire(self) -> dict[str, Any]:
        out = f.head("error", code=self.code, message=self.message)
        if self.step_id is not None:
            out["step_id"] = self.step_id
        return out


def _json_parts(
    obj: Any, default_model: str, names: tuple[str, ...], required: str
) -> tuple[dict[str, Any], Tensors]:
    """Split a plain-JSON request into (params, tensors); model and version are optional."""
    if not isinstance(obj, dict):
        raise BadRequest("the JSON body must be an object")
    params = {k: v for k, v in obj.items() if k not in names}
    params.setdefault("model", default_model)
    params.setdefault("version", PROTOCOL_VERSION)
    tensors: Tensors = {}
    for name in names:
        t = c.from_nested(obj, name, required=name == required)
        if t is not None:
            tensors[name] = t
    return params, tensors
