"""seqlab -> Hugging Face transformers: ``to_hf(model)`` and ``save_hf(model, out_dir, tokenizer)``.

    from seqlab.models import create
    from seqlab.interop.hf_export import save_hf, to_hf

    hf = to_hf(create("test-gpt"))          # a GPT2LMHeadModel with the same weights and logits
    save_hf(create("test-mamba"), "out/")    # config.json + model.safetensors (+ tokenizer files)

The reverse of :func:`seqlab.interop.from_hf`, so ``from_hf(to_hf(m))`` gives back m's tensors:

    family 'lm', attention mixer, learned positions   -> GPT2LMHeadModel      (seqlab.interop.hf_export_lm)
    family 'lm', attention mixer, RoPE                -> LlamaForCausalLM
    family 'lm', mamba mixer                          -> MambaForCausalLM
    family 'lm', mamba2 mixer                         -> Mamba2ForCausalLM
    family 'encoder' (BERT-style)                     -> BertModel            (seqlab.interop.hf_export_encoders)
    family 'vit', with a head / without               -> ViTForImageClassification / ViTModel

Other families (seq2seq with RNN attention, the captioners, the video and speech models, the encoder-decoder
Transformer) and LMs with other mixers (LSTM, GRU, S4D, linear attention, ...) have no transformers class:
a ValueError names the family and the exportable ones. A config the target class cannot represent is a
ValueError naming the field; nothing is exported approximately.

``save_hf`` writes into a new (or empty) directory only: a directory that holds anything is refused, so no
file a user saved is ever replaced. The files are written into a temporary sibling and renamed into place,
so an interrupted export leaves nothing half-written under the requested name.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from seqlab.interop.hf_export_encoders import bert_hf_config, export_bert, export_vit, vit_hf_config
from seqlab.interop.hf_export_lm import export_lm, lm_hf_config
from seqlab.interop.hf_export_tokenizer import hf_tokenizer
from seqlab.outfiles import nearest_existing
from seqlab.training.manifest import umask

__all__ = ["EXPORTABLE", "EXPORTERS", "HFExport", "check_exportable", "check_out_dir", "save_hf", "to_hf"]

log = logging.getLogger(__name__)

EXPORTERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "lm": export_lm,
    "encoder": export_bert,
    "vit": export_vit,
}
"""seqlab model family -> its exporter (the LM exporter picks GPT-2, Llama, Mamba or Mamba-2 from the config)."""

HF_CONFIGS: dict[str, Callable[[nn.Module], object]] = {
    "lm": lm_hf_config,
    "encoder": bert_hf_config,
    "vit": vit_hf_config,
}
"""seqlab model family -> the transformers config its exporter writes, built from the model's config alone."""

EXPORTABLE = (
    "'lm' with the attention mixer (GPT2LMHeadModel, LlamaForCausalLM), the mamba mixer (MambaForCausalLM) or "
    "the mamba2 mixer (Mamba2ForCausalLM), 'encoder' (BertModel), 'vit' (ViTModel, ViTForImageClassification)"
)

_AUTO_CLASS = {
    "GPT2LMHeadModel": "AutoModelForCausalLM",
    "LlamaForCausalLM": "AutoModelForCausalLM",
    "MambaForCausalLM": "AutoModelForCausalLM",
    "Mamba2ForCausalLM": "AutoModelForCausalLM",
    "BertModel": "AutoModel",
    "ViTModel": "AutoModel",
    "ViTForImageClassification": "AutoModelForImageClassification",
}


@dataclass
class HFExport:
    """What :func:`save_hf` wrote."""

    path: Path
    hf_class: str
    """The transformers class, e.g. 'GPT2LMHeadModel'."""
    files: list[str]
    tokenizer_note: str | None = None
    """None when a tokenizer was written (or none was given); otherwise why none was written."""
    load_kwargs: str = ""
    """What ``from_pretrained`` must be told beyond the path: ``add_pooling_layer=False`` for a BertModel or
    ViTModel written without a pooler (the config does not record it; without it transformers would add a
    randomly initialized pooler)."""

    @property
    def auto_class(self) -> str:
        """The ``transformers.Auto*`` class that loads it."""
        return _AUTO_CLASS[self.hf_class]

    @property
    def has_tokenizer(self) -> bool:
        return "tokenizer.json" in self.files

    def load_snippet(self) -> str:
        """Two lines of Python that load what was written."""
        names = f"{self.auto_class}, AutoTokenizer" if self.has_tokenizer else self.auto_class
        extra = f", {self.load_kwargs}" if self.load_kwargs else ""
        load = f"{self.auto_class}.from_pretrained({str(self.path)!r}{extra})"
        if self.has_tokenizer:
            load = f"model, tokenizer = {load}, AutoTokenizer.from_pretrained({str(self.path)!r})"
        else:
            load = f"model = {load}"
        return f"from transformers import {names}\n{load}"


def _family(model: nn.Module) -> str:
    """``model``'s family when it has an exporter; a ValueError naming the exportable families otherwise."""
    family = getattr(model, "family", None)
    if family not in EXPORTERS:
        what = f"a {family!r} model" if family else f"a {type(model).__name__}"
        raise ValueError(
            f"cannot export {what} to Hugging Face: transformers has no class for this family. "
            f"Exportable seqlab families: {EXPORTABLE}"
        )
    return family


def to_hf(model: nn.Module) -> nn.Module:
    """The transformers model equivalent to a seqlab ``model``: a copy of its weights, same device, dtype, mode."""
    return EXPORTERS[_family(model)](model)


def check_exportable(model: nn.Module) -> None:
    """The ValueError ``to_hf`` would raise for ``model``'s family or config, raised without touching weights:
    ``model`` may live on the meta device (``seqlab export`` checks a checkpoint this way before loading it)."""
    HF_CONFIGS[_family(model)](model)


def check_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` as a Path when it is absent or an empty directory; a FileExistsError otherwise."""
    out = Path(out_dir)
    if not out.name or out.resolve() == Path.cwd().resolve():
        raise ValueError(
            f"--out {str(out_dir)!r} names no directory of its own; give a new one, e.g. exports/model"
        )
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise FileExistsError(f"{out} exists and is not a directory; choose another output path")
    if not (parent := nearest_existing(out.parent)).is_dir():  # found now, not after loading a large model
        raise FileExistsError(f"--out {out}: {parent} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()):
        raise FileExistsError(
            f"{out} already holds files; seqlab never writes over them: choose a new or empty directory "
            f"(e.g. {out.with_name(out.name + '-hf')})"
        )
    return out


def _context_limit(model: nn.Module) -> int | None:
    limit = getattr(model, "context_limit", None)
    if limit is None and getattr(model, "family", None) == "encoder":
        limit = model.config.max_seq_len
    return limit


def _write(hf: nn.Module, tokenizer, tmp: Path, model: nn.Module) -> str | None:
    """Write the model (and the tokenizer, when it can be represented) into ``tmp``; the tokenizer's note."""
    from safetensors import SafetensorError

    try:
        hf.save_pretrained(str(tmp), safe_serialization=True)
    except SafetensorError as e:  # a full disk: an OSError naming the folder, not a bug
        raise OSError(f"could not write the export beside {tmp.parent}: {e}") from None
    if tokenizer is None:
        return None
    hf_tok, why = hf_tokenizer(tokenizer, _context_limit(model))
    if hf_tok is None:
        log.warning("no tokenizer was written: %s", why)
        return why
    hf_tok.save_pretrained(str(tmp))
    return None


def save_hf(model: nn.Module, out_dir: str | Path, tokenizer=None) -> HFExport:
    """Write ``to_hf(model)`` as ``config.json`` + ``model.safetensors`` into the new directory ``out_dir``,
    with the files of a fast tokenizer when ``tokenizer`` (a seqlab tokenizer) can be represented.

    ``out_dir`` must not exist or be empty (FileExistsError otherwise). A tokenizer that cannot be exported
    is logged as a warning and said in ``HFExport.tokenizer_note``; the model is written anyway.
    """
    out = check_out_dir(out_dir)
    hf = to_hf(model)  # refused configurations raise before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-{out.name}-"))
    try:
        note = _write(hf, tokenizer, tmp, model)
        mask = umask()
        tmp.chmod(0o777 & ~mask)  # an ordinary directory, not mkdtemp's 0700
        for f in tmp.iterdir():  # and ordinary files (some writers leave 0600)
            f.chmod(0o666 & ~mask)
        check_out_dir(out)  # still new or empty: nothing of the user's is replaced
        os.replace(tmp, out)  # atomic on POSIX; replaces an empty directory only
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # a BertModel or ViTModel built with add_pooling_layer=False
    no_pooler = getattr(hf, "pooler", "absent") is None
    files = sorted(p.name for p in out.iterdir())
    return HFExport(out, type(hf).__name__, files, note, "add_pooling_layer=False" if no_pooler else "")
