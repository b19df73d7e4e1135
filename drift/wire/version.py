"""The wire protocol's version: every message carries it; another major version is refused.

The wire layer owns it (it depends on nothing above it); `drift.PROTOCOL_VERSION` re-exports it.
"""

PROTOCOL_VERSION = "1.0"
