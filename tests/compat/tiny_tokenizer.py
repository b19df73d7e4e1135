"""A real transformers tokenizer for the tiny test models: one token per printable character.

Petals' and transformers' users call `tokenizer("A cat sat", return_tensors="pt")`, pad
batches and decode; the tiny models have 256 ids, so this tokenizer maps the 95 printable
ASCII characters to ids 3..97 (0 pad, 1 unknown, 2 end of sequence). Built in memory with
the `tokenizers` library; nothing is downloaded.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL = {"<pad>": 0, "<unk>": 1, "<eos>": 2}


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = dict(SPECIAL)
    vocab.update({chr(c): len(SPECIAL) + i for i, c in enumerate(range(32, 127))})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<eos>")  # fmt: skip
