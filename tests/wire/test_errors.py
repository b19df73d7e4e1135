"""LengthExceeded says "Maximum length exceeded" (Petals' callers match it), once, across the wire."""

from __future__ import annotations

import pytest

from drift.wire.errors import BadRequest, LengthExceeded, from_payload


def test_length_exceeded_names_petals_phrase():
    err = LengthExceeded("session max_length 4 exceeded: position 4 + 1 new tokens")
    assert str(err).startswith("Maximum length exceeded: session max_length 4")
    assert isinstance(err, ValueError) and isinstance(err, BadRequest)
    with pytest.raises(ValueError, match=r"Maximum length exceeded"):
        raise err


def test_length_exceeded_round_trip_keeps_one_phrase():
    sent = LengthExceeded("max_length 99 exceeds this server's limit of 24", param="max_length")
    back = from_payload(sent.to_payload(), 400)
    assert type(back) is LengthExceeded
    assert back.message == sent.message
    assert back.message.lower().count("maximum length exceeded") == 1
    assert back.details == {"param": "max_length"}
