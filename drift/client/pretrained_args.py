"""from_pretrained's keyword arguments as transformers users pass them.

DRIFT uses token, revision, cache_dir, device and dtype (drift.client.loading), a `config`
of the same architecture, and config fields; it ignores, with a warning saying why, the
arguments about placing or quantizing weights it does not hold; it refuses remote code and
unknown arguments (a TypeError, as transformers raises). Pure: no loading here.
"""

from __future__ import annotations

import warnings
from typing import Any

from transformers import PretrainedConfig

# argument -> why it changes nothing on a DRIFT client
IGNORED: dict[str, str] = {
    "device_map": "the client holds only the embeddings and the head; place them with device=",
    "max_memory": "the client holds only the embeddings and the head",
    "offload_folder": "the client holds only the embeddings and the head",
    "offload_state_dict": "the client holds only the embeddings and the head",
    "offload_buffers": "the client holds only the embeddings and the head",
    "low_cpu_mem_usage": "the client reads only its own tensors, one by one",
    "quantization_config": "the client's embeddings and head stay in dtype=; each server "
    "chooses how its blocks are stored",
    "load_in_8bit": "the client's embeddings and head stay in dtype=; each server chooses how "
    "its blocks are stored",
    "load_in_4bit": "the client's embeddings and head stay in dtype=; each server chooses how "
    "its blocks are stored",
    "attn_implementation": "attention runs on the servers",
    "use_safetensors": "DRIFT reads safetensors (or GGUF) only, never pickle",
    "weights_only": "DRIFT reads safetensors (or GGUF) only, never pickle",
    "local_files_only": "set HF_HUB_OFFLINE=1 to stay offline",
    "force_download": "files already in the cache are used",
    "resume_download": "downloads always resume",
    "proxies": "set HTTPS_PROXY for the Hub",
    "output_loading_info": "there is no loading report",
    "ignore_mismatched_sizes": "the checkpoint's sizes are the servers' sizes",
    "tp_plan": "the servers run the blocks",
}


def drop_ignored(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` without the arguments that do not apply (each warned about, saying why);
    remote code is refused."""
    if kwargs.get("trust_remote_code"):
        raise ValueError("trust_remote_code=True is refused: DRIFT never runs code from a "
                         "checkpoint; its architectures are transformers' own")  # fmt: skip
    kept = {}
    for key, value in kwargs.items():
        if key == "trust_remote_code":
            continue
        if key in IGNORED:
            if value is not None and value is not False:
                warnings.warn(f"from_pretrained({key}=...) is ignored: {IGNORED[key]}",
                              UserWarning, stacklevel=4)  # fmt: skip
            continue
        kept[key] = value
    return kept


def apply_overrides(config: PretrainedConfig, overrides: dict[str, Any]) -> None:
    """Set config fields from keyword arguments, as transformers does; an argument that is
    no field of the config is a TypeError."""
    unknown = sorted(key for key in overrides if not hasattr(config, key))
    if unknown:
        raise TypeError(
            f"from_pretrained() got unexpected keyword argument(s) {unknown}: neither a DRIFT "
            f"argument nor a field of the {config.model_type} config"
        )
    for key, value in overrides.items():
        setattr(config, key, value)


def check_config(given: Any, checkpoint: PretrainedConfig) -> PretrainedConfig:
    """`config=`: used when it describes the checkpoint's architecture (the servers run that
    one); other fields (output_hidden_states, use_cache, ids) may differ."""
    from drift.models.checkpoint import architecture_dict

    if not isinstance(given, PretrainedConfig):
        raise TypeError(f"config= must be a transformers PretrainedConfig, got {type(given)}")
    given = given.get_text_config()
    mine, theirs = architecture_dict(checkpoint), architecture_dict(given)
    differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if differ:
        raise ValueError(
            f"config= describes another architecture than the checkpoint the servers run "
            f"(fields {differ}); change only fields such as output_hidden_states or use_cache"
        )
    return given
