"""Versions on the wire: DRIFT's release (records, /health) and the protocol every message
carries (another major version is refused). The wire layer owns them; it depends on nothing
above it, and `drift.__version__` / `drift.PROTOCOL_VERSION` re-export them.
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = "1.0"


def same_major(version: str, ours: str = PROTOCOL_VERSION) -> bool:
    """Whether a peer speaking protocol `version` interoperates with `ours`: the same major
    version (a newer minor adds only fields an older peer ignores or keeps)."""
    return version.split(".")[0] == ours.split(".")[0]
