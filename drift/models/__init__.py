"""Model code: weights by block, one adapter per architecture family, spans and the client head.

`checkpoint` finds weights; `registry` + `adapters/` know each family; `span` runs a slice of
blocks (`session` adds a KV cache); `head` is what a client holds. No aiohttp, no I/O beyond
reading weights.
"""
