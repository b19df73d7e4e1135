"""The block server: compute routes (/blocks, /forward, /backward, /inference, /metrics)
added to the membership node's aiohttp app, KV-cache budget, sessions, compute executor.

Build one with `drift.server.build.load_server` + `attach_server`; see docs/internals.md.
"""
