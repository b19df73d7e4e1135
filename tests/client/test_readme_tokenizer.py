"""drift.load_tokenizer: the tokenizer for the names the distributed model takes.

A local model dir, the "smollm2" alias and the GGUF file behind it all give the tokenizer
transformers loads from the resolved checkpoint; a missing path is a clear NotFound.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

import drift
from drift.client import load_tokenizer
from drift.models.checkpoint import open_checkpoint
from drift.models.sources.aliases import ALIASES, resolve_alias
from drift.wire.errors import NotFound
from tests.api.apps import char_tokenizer, tiny_chat_model

TEXT = "A cat sat on the mat.\nHello!"


def test_lazy_export_from_package_root() -> None:
    assert drift.load_tokenizer is load_tokenizer


def test_local_dir(tmp_path) -> None:
    tiny_chat_model().save_pretrained(tmp_path, safe_serialization=True)
    char_tokenizer().save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert tok(TEXT)["input_ids"] == char_tokenizer()(TEXT)["input_ids"]
    assert tok.chat_template == char_tokenizer().chat_template
    assert load_tokenizer(str(tmp_path))(TEXT)["input_ids"] == tok(TEXT)["input_ids"]


def test_missing_path_is_not_found(tmp_path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        load_tokenizer(tmp_path / "no-such-model")


@pytest.mark.slow
def test_alias_and_gguf(smollm2_cache) -> None:
    ckpt = open_checkpoint("smollm2", cache_dir=smollm2_cache, blocks=range(0))
    expected = AutoTokenizer.from_pretrained(ckpt.path)
    ids = expected(TEXT)["input_ids"]
    assert len(ids) > 5
    by_alias = load_tokenizer("smollm2", cache_dir=smollm2_cache)
    assert by_alias(TEXT)["input_ids"] == ids
    assert by_alias.decode(ids) == expected.decode(ids)
    gguf = resolve_alias(ALIASES["smollm2"], smollm2_cache)
    by_file = load_tokenizer(gguf, cache_dir=smollm2_cache)
    assert by_file(TEXT)["input_ids"] == ids
    assert by_file.eos_token_id == expected.eos_token_id is not None
