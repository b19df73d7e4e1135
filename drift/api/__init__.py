"""OpenAI-compatible HTTP API over a transformers-compatible causal LM (local or a swarm).

`build_api_app(engine, ApiConfig)` (drift.api.app) serves /v1/models, /v1/chat/completions,
/v1/completions (SSE with `stream: true`) and /health; `CausalLMEngine` (drift.api.engine)
wraps model + tokenizer; `swarm_engine` (drift.api.swarm) builds one over drift.client.
"""
