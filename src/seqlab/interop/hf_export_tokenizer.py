"""seqlab tokenizers -> a Hugging Face fast tokenizer that ``AutoTokenizer.from_pretrained`` loads.

    char        a ``tokenizers`` WordLevel model over the characters, ids in seqlab's order, with a pre-tokenizer
                that isolates every character and a Fuse decoder that joins them back without spaces; a
                character outside the vocabulary is an error there as it is in seqlab (there is no [UNK])
    bpe         the trained byte-level BPE ``tokenizers.Tokenizer`` itself; ``<|endoftext|>`` is its EOS token
    wordpiece   the trained WordPiece ``tokenizers.Tokenizer`` itself with BERT's special tokens
    translation not exportable: a source and a target vocabulary, where a HF tokenizer has one

Each is wrapped in ``PreTrainedTokenizerFast`` (``clean_up_tokenization_spaces=False``, so decoding leaves the
text as seqlab's tokenizer gives it). Encoding adds no special tokens, as seqlab's tokenizers add none.
"""

from __future__ import annotations

import json

from seqlab.interop.hf_export_lm import transformers_lib

__all__ = ["hf_tokenizer"]

_WORDPIECE_SPECIALS = {
    "unk_token": "[UNK]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


def _char_backend(chars: str):
    """A ``tokenizers.Tokenizer`` giving character i of ``chars`` the id i."""
    import tokenizers as tk

    tok = tk.Tokenizer(tk.models.WordLevel({ch: i for i, ch in enumerate(chars)}, unk_token=None))
    tok.pre_tokenizer = tk.pre_tokenizers.Split(
        tk.Regex(r"[\s\S]"), behavior="isolated"
    )  # one code point each
    tok.decoder = tk.decoders.Fuse()  # join the characters with nothing between them
    return tok


def _specials(backend, wanted: dict[str, str]) -> dict[str, str]:
    return {role: token for role, token in wanted.items() if backend.token_to_id(token) is not None}


def hf_tokenizer(tokenizer, model_max_length: int | None = None) -> tuple[object | None, str | None]:
    """``(PreTrainedTokenizerFast, None)`` for a seqlab tokenizer, or ``(None, why it cannot be exported)``."""
    data = json.loads(tokenizer.to_json())
    kind = data.get("type")
    if kind == "char":
        backend, specials = _char_backend(data["chars"]), {}
    elif kind == "bpe":
        backend = tokenizer.tokenizer
        specials = _specials(backend, {"eos_token": "<|endoftext|>"})
    elif kind == "wordpiece":
        backend = tokenizer.tokenizer
        specials = _specials(backend, _WORDPIECE_SPECIALS)
    elif kind == "translation":
        return None, (
            "a translation tokenizer has a source and a target vocabulary; a Hugging Face tokenizer has one"
        )
    else:
        return None, f"seqlab does not know how to export a {kind!r} tokenizer"
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    hf = transformers_lib().PreTrainedTokenizerFast(
        tokenizer_object=backend, clean_up_tokenization_spaces=False, **specials, **extra
    )
    if kind == "char" and hf(data["chars"])["input_ids"] != list(range(len(data["chars"]))):
        return None, "the character vocabulary did not encode to seqlab's ids through a WordLevel tokenizer"
    return hf, None
