"""The inference step's messages: `StepRequest` (a client's step, or one pushed on by another
server, naming the hops after it) and `StepResponse` (the step's output and whether it was
pushed on). Validated once in `from_wire`, then trusted; the push fields are theirs too
(drift.wire.push). Knows nothing about sockets or models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from drift.wire import checks as c
from drift.wire import fields as f
from drift.wire.errors import BadRequest
from drift.wire.extras import BLOCK_STATES, NO_EXTRAS
from drift.wire.push import NEXT, PUSH_ERROR, PUSHED, SESSION, TOKEN, NextHop, parse_next

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class StepRequest:
    """One inference step: new tokens' hidden states at `position` (< cache length rolls back)."""

    step_id: int
    position: int  # where these tokens start in the sequence
    hidden_states: torch.Tensor  # [B, T, H]
    hypo_ids: torch.Tensor | None = None  # [B] int64: reorder cache rows first (beam search)
    attention_mask: torch.Tensor | None = None  # [B, T] of the new tokens
    prompts: torch.Tensor | None = None  # [n_blocks, B, P, H]
    extras: Tensors = field(default_factory=dict)  # per-layer inputs, consumed K/V (extras.py)
    donate: tuple[int, ...] = ()  # blocks whose shared K/V (new positions) the reply carries
    block_states: bool = False  # the reply carries each block's output (extras.BLOCK_STATES)
    next_hops: tuple[NextHop, ...] = ()  # the spans its output is pushed on to, in order
    session_id: str | None = None  # a pushed step: the session it is for on the receiver
    push_token: str | None = field(default=None, repr=False)  # a pushed step: that session's
    # secret push token (drift.wire.push), checked before the step touches the session

    TENSORS = ("hidden_states", "hypo_ids", "attention_mask", "prompts")

    @classmethod
    def from_wire(
        cls, params: dict[str, Any], tensors: Tensors, *, hidden_size: int | None = None,
        limits: c.StepLimits | None = None,
    ) -> StepRequest:  # fmt: skip
        """Validated once: structure, and the session's promises when `limits` are given
        (the server passes its session's), so the session and the span trust it."""
        c.check_version(params)
        if params.get("type") != "step":
            raise BadRequest(f"expected a 'step' frame, got type {params.get('type')!r}")
        spec = limits.extras if limits is not None else NO_EXTRAS
        c.no_extra_tensors(tensors, cls.TENSORS + spec.input_names())
        position = c.get_int(params, "position")
        own, named = f.split(tensors, cls.TENSORS)
        inputs = c.check_pass(
            c.tensor(own, "hidden_states"), own.get("attention_mask"),
            own.get("prompts"), hypo_ids=own.get("hypo_ids"),
            hidden_size=limits.hidden_size if limits is not None else hidden_size,
            n_blocks=limits.n_blocks if limits is not None else None, extras=named, spec=spec,
        )  # fmt: skip
        if limits is not None:
            c.check_step_limits(inputs, position, limits)
        req = cls(
            step_id=c.get_int(params, "step_id"),
            position=position,
            hidden_states=inputs.hidden,
            hypo_ids=inputs.hypo_ids,
            attention_mask=inputs.attention_mask,
            prompts=inputs.prompts,
            extras=inputs.extras,
            donate=c.get_donate(params, spec),
            block_states=c.get_flag(params, BLOCK_STATES),
            next_hops=parse_next(params),
            session_id=c.get_str(params, SESSION) if SESSION in params else None,
            push_token=c.get_str(params, TOKEN) if TOKEN in params else None,
        )
        if req.next_hops and not req.pushable:
            raise BadRequest("a step carrying extras, deep prompts or asking for K/V or block "
                             "states cannot be pushed: the client routes those")  # fmt: skip
        return req

    @property
    def pushable(self) -> bool:
        """Only a plain step goes on by push (the client routes the others)."""
        return not (self.extras or self.donate or self.block_states or self.prompts is not None)

    def onward(self, hidden: torch.Tensor) -> StepRequest:
        """The step pushed to `next_hops[0]`: `hidden` (this span's output), re-addressed to
        that hop's session, push token and step id, naming the hops after it."""
        first = self.next_hops[0]
        return dataclasses.replace(self, step_id=first.step_id, session_id=first.session_id,
                                   push_token=first.push_token, next_hops=self.next_hops[1:],
                                   hidden_states=hidden)  # fmt: skip

    def to_wire(self) -> tuple[dict[str, Any], Tensors]:
        params = f.head("step", step_id=self.step_id, position=self.position)
        if self.session_id is not None:
            params[SESSION] = self.session_id
        if self.push_token is not None:
            params[TOKEN] = self.push_token
        if self.next_hops:
            params[NEXT] = [hop.to_wire() for hop in self.next_hops]
        return f.with_donate(params, self.donate, self.block_states), f.present(
            hidden_states=self.hidden_states,
            hypo_ids=self.hypo_ids,
            attention_mask=self.attention_mask,
            prompts=self.prompts,
            **self.extras,
        )


@dataclass(frozen=True)
class StepResponse:
    step_id: int
    hidden_states: torch.Tensor  # [B, T, H]
    extras: Tensors = field(default_factory=dict)  # donated K/V of the new positions, by name
    pushed: bool = False  # the step went on to its next hop
    push_error: str | None = None  # why it did not (the client relays from there)

    @classmethod
    def from_wire(
        cls, params: dict[str, Any], tensors: Tensors, *, donate: tuple[int, ...] = (),
        states: int = 0,
    ) -> StepResponse:  # fmt: skip
        """`donate`: the blocks whose K/V the step asked back (exactly those come);
        `states`: how many blocks' outputs it asked for (0: not asked)."""
        c.check_version(params)
        own, named = f.split(tensors, ("hidden_states",))
        hidden = c.check_activation("hidden_states", c.tensor(own, "hidden_states"), rank=3,
                                    hidden_size=None)  # fmt: skip
        extras = f.reply_extras(named, f.donated_names(donate), hidden, states)
        error = params.get(PUSH_ERROR)
        return cls(c.get_int(params, "step_id"), hidden, extras, c.get_flag(params, PUSHED),
                   None if error is None else str(error))  # fmt: skip

    def to_wire(self) -> tuple[dict[str, Any], Tensors]:
        params = f.head("step_result", step_id=self.step_id)
        if self.pushed:
            params[PUSHED] = True
        if self.push_error is not None:
            params[PUSH_ERROR] = self.push_error
        return params, {"hidden_states": self.hidden_states, **self.extras}
