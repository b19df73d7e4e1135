"""Where a checkpoint's files come from: local directories, GGUF files, aliases, the Hub.

Each source turns a user's name into a local directory holding config.json and safetensors
weights (downloading or converting first when needed). None of them knows about Checkpoint,
spans or adapters; drift.models.checkpoint composes them.
"""
