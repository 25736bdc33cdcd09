r"""A spoken-word corpus made offline with the espeak-ng formant synthesizer, cached in the user's data folder.

Two kinds (``kind``):

    keywords  one word per utterance: the ten digits and ten commands (``KEYWORDS``), in turn, so the classes
              are balanced
    digits    a string of ``min_digits`` to ``max_digits`` spoken digits ("seven three nine"), uniformly drawn

Speakers: an English accent of espeak-ng (``ACCENTS``: American, British RP, Scottish, Lancastrian, West
Midlands, Caribbean, New York, ...) combined with a voice variant (``espeak-ng --voices=variant``: f1-f5, m1-m8,
croak, whisper, klatt, ... about a hundred), a speaking rate (``-s``, words per minute) and a pitch (``-p``,
0-99), each drawn per utterance. The **variants** are split between train, validation and test (75/10/15%,
variants that differ only in a trailing number, as klatt2 and klatt3, kept together), so no test voice is
heard in training, in any accent. Each utterance gets 0-0.25 s of silence before and after, then white noise
at a signal-to-noise ratio drawn from ``snrs`` (None: clean):

    n ~ N(0, σ²),  σ² = P_speech / 10^{SNR/10},  P_speech = mean of x² over the samples louder than -40 dB

Waveforms are resampled from espeak-ng's 22,050 Hz and turned into features (``speech_data.Features``) in the
worker processes; only the features are cached (float16), under ``$XDG_DATA_HOME/seqlab/speech`` (default
``~/.local/share/seqlab/speech``) in a folder named by a hash of every setting, built once (a progress bar,
``jobs`` processes) and read back afterwards. A file lock lets concurrent processes wait for one builder.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from seqlab.tasks.base import MissingDependencyError
from seqlab.tasks.speech_data import Features, Utterances, resample

log = logging.getLogger("seqlab.tasks")

__all__ = ["ACCENTS", "DIGITS", "KEYWORDS", "CorpusSettings", "data_root", "load_corpus", "split_variants"]

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
KEYWORDS = (*DIGITS, "yes", "no", "up", "down", "left", "right", "stop", "go", "on", "off")
ACCENTS = ("en-us", "en-gb", "en-gb-x-rp", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029")
ACCENTS += ("en-us-nyc",)
ESPEAK_RATE = 22050
SPLIT_FRACTIONS = {"test": 0.15, "val": 0.10}
INSTALL = "apt-get install -y espeak-ng"
SERIAL_BELOW = 400
"""Corpora smaller than this are built in this process."""


@dataclass(frozen=True)
class CorpusSettings:
    """Everything that determines the corpus (its cache folder is named by their hash)."""

    kind: str = "keywords"
    n_train: int = 3000
    n_eval: int = 500
    """Utterances in each of validation and test."""
    min_digits: int = 2
    max_digits: int = 5
    snrs: tuple = (None, 20.0, 10.0)
    rates: tuple = (130, 210)
    """Speaking rate range in words per minute (espeak-ng's default is 175)."""
    pitches: tuple = (25, 75)
    seed: int = 0
    features: Features = field(default_factory=Features)

    def key(self) -> str:
        text = json.dumps({**asdict(self), "variants": espeak_variants()}, sort_keys=True)
        return f"{self.kind}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def data_root(cache_dir: str | Path | None = None) -> Path:
    """Where generated corpora live: ``cache_dir``, else $XDG_DATA_HOME/seqlab/speech, else
    ~/.local/share/seqlab/speech (never inside the repository)."""
    if cache_dir is not None:
        return Path(cache_dir)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "seqlab" / "speech"


def check_espeak() -> str:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise MissingDependencyError(
            f"the generated speech corpus needs the espeak-ng synthesizer: {INSTALL} "
            "(or train on your own recordings: source='folder', path=FOLDER)"
        )
    return exe


@lru_cache(maxsize=1)
def espeak_variants() -> tuple[str, ...]:
    """The voice variants this espeak-ng installation has (``espeak-ng --voices=variant``), sorted."""
    out = subprocess.run([check_espeak(), "--voices=variant"], capture_output=True, text=True, check=True)
    names = re.findall(r"!v/(\S+)", out.stdout)
    if not names:
        raise MissingDependencyError(f"espeak-ng lists no voice variants; reinstall it: {INSTALL}")
    return tuple(sorted(set(names)))


def split_variants(variants: tuple[str, ...]) -> dict[str, list[str]]:
    """train/val/test variants: groups of variants (names without a trailing number) shuffled with a fixed
    seed, 15% of the groups to test, 10% to validation; the same split for every corpus."""
    groups: dict[str, list[str]] = {}
    for v in variants:
        groups.setdefault(re.sub(r"\d+$", "", v.lower()), []).append(v)
    keys = sorted(groups)
    order = [keys[i] for i in np.random.default_rng(1234).permutation(len(keys))]
    n_test = max(1, round(SPLIT_FRACTIONS["test"] * len(keys)))
    n_val = max(1, round(SPLIT_FRACTIONS["val"] * len(keys)))
    parts = {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}
    return {split: sorted(v for g in gs for v in groups[g]) for split, gs in parts.items()}


def plan_items(settings: CorpusSettings) -> list[dict[str, Any]]:
    """Every utterance to synthesize: text, speaker, rate, pitch, padding, SNR and noise seed, per split."""
    s, variants = settings, split_variants(espeak_variants())
    items = []
    for code, split in enumerate(("train", "val", "test")):
        n = s.n_train if split == "train" else s.n_eval
        for i in range(n):
            rng = np.random.default_rng([s.seed, code, i])
            if s.kind == "keywords":
                text = KEYWORDS[i % len(KEYWORDS)]
            else:
                k = int(rng.integers(s.min_digits, s.max_digits + 1))
                text = " ".join(DIGITS[d] for d in rng.integers(0, 10, k))
            items.append(
                {
                    "split": split,
                    "text": text,
                    "accent": ACCENTS[int(rng.integers(len(ACCENTS)))],
                    "variant": variants[split][int(rng.integers(len(variants[split])))],
                    "rate": int(rng.integers(s.rates[0], s.rates[1] + 1)),
                    "pitch": int(rng.integers(s.pitches[0], s.pitches[1] + 1)),
                    "pad": rng.uniform(0.0, 0.25, 2).tolist(),
                    "snr": s.snrs[int(rng.integers(len(s.snrs)))],
                    "noise_seed": int(rng.integers(1 << 31)),
                }
            )
    return items


def synthesize(item: dict[str, Any], sample_rate: int) -> np.ndarray:
    """The item's waveform (n,) float32 at ``sample_rate``: espeak-ng, resampled, padded, noise added."""
    import soundfile as sf

    voice = f"{item['accent']}+{item['variant']}"
    cmd = ["espeak-ng", "-v", voice, "-s", str(item["rate"]), "-p", str(item["pitch"]), "--stdout"]
    done = subprocess.run([*cmd, item["text"]], capture_output=True)
    if done.returncode != 0 or len(done.stdout) <= 44:  # 44: a WAV header and no samples
        err = done.stderr.decode(errors="replace").strip()
        raise RuntimeError(f"espeak-ng -v {voice} could not say {item['text']!r}: {err or 'no audio'}")
    wave, rate = sf.read(io.BytesIO(done.stdout), dtype="float32")  # (n,) at 22,050 Hz
    wave = resample(wave, rate, sample_rate)
    before, after = (int(p * sample_rate) for p in item["pad"])
    wave = np.concatenate([np.zeros(before, np.float32), wave, np.zeros(after, np.float32)])
    if item["snr"] is not None:
        loud = np.abs(wave) > np.abs(wave).max() * 1e-2  # samples within 40 dB of the peak
        power = float(np.mean(wave[loud] ** 2))
        sigma = np.sqrt(power / 10 ** (item["snr"] / 10))
        wave = wave + np.random.default_rng(item["noise_seed"]).normal(0, sigma, wave.shape).astype(
            np.float32
        )
    return wave


def _one_thread() -> None:
    """A worker process's initializer: one torch thread each, so that ``jobs`` processes use ``jobs`` cores."""
    import torch

    torch.set_num_threads(1)


def _features_of(args: tuple[dict[str, Any], Features]) -> np.ndarray:
    """One item -> its features (t, m) float16."""
    item, features = args
    return features(synthesize(item, features.sample_rate)).half().numpy()


def build_corpus(settings: CorpusSettings, folder: Path, jobs: int = 2) -> None:
    """Synthesize every item (``jobs`` processes, a progress bar) and write the corpus into ``folder``."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    import torch
    from tqdm.auto import tqdm

    items, t0 = plan_items(settings), time.perf_counter()
    work = [(item, settings.features) for item in items]
    desc = f"speech corpus ({settings.kind}, {len(items)} utterances, once)"
    if jobs == 1 or len(work) < SERIAL_BELOW:  # a worker's start (importing torch) costs more than it saves
        feats = [_features_of(w) for w in tqdm(work, desc=desc)]
    else:
        with ProcessPoolExecutor(jobs, mp.get_context("spawn"), initializer=_one_thread) as pool:
            feats = list(tqdm(pool.map(_features_of, work, chunksize=16), total=len(work), desc=desc))
    speakers = [f"{it['accent']}+{it['variant']}" for it in items]
    corpus = Utterances.of([torch.from_numpy(f) for f in feats], [it["text"] for it in items], speakers)
    corpus.save(folder)
    meta = {"settings": asdict(settings), "items": items, "seconds": time.perf_counter() - t0}
    (folder / "corpus.json").write_text(json.dumps(meta), encoding="utf-8")
    log.info("built %s in %.0f s", folder, meta["seconds"])


def load_corpus(
    settings: CorpusSettings, cache_dir: str | Path | None = None, jobs: int = 2
) -> tuple[Utterances, dict[str, list[int]], Path]:
    """(all utterances, rows of each split, its folder): read from the cache, built there first if absent."""
    check_espeak()
    root = data_root(cache_dir)
    folder = root / settings.key()
    if not (folder / "corpus.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f".{folder.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process building the same corpus: wait for it
            if not (folder / "corpus.json").is_file():
                tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{folder.name}-"))
                try:
                    build_corpus(settings, tmp, jobs)
                    os.replace(tmp, folder)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    meta = json.loads((folder / "corpus.json").read_text(encoding="utf-8"))
    splits: dict[str, list[int]] = {"train": [], "val": [], "test": []}
    for i, item in enumerate(meta["items"]):
        splits[item["split"]].append(i)
    return Utterances.load(folder), splits, folder
