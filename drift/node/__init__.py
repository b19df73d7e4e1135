"""The membership node every DRIFT node runs: aiohttp app, gossip, auth, error mapping.

No torch here, so `drift dht` starts fast; drift/server adds compute routes to this app.
"""

from drift.node.app import NODE, build_node_app, find_web_dir
from drift.node.auth import auth_headers, auth_middleware, bearer_headers
from drift.node.config import NodeConfig
from drift.node.membership import MembershipNode
from drift.node.middleware import error_middleware
from drift.node.runner import RunningApp, run_node, start_app

__all__ = [
    "NODE",
    "MembershipNode",
    "NodeConfig",
    "RunningApp",
    "auth_headers",
    "auth_middleware",
    "bearer_headers",
    "build_node_app",
    "error_middleware",
    "find_web_dir",
    "run_node",
    "start_app",
]
