r"""Speech as spectrogram slices: WAV files in and out, log-mel features, a set of utterances, their split.

Notation: ``n`` samples, ``t`` frames, ``m`` mel bands, ``f`` FFT bins (n_fft / 2 + 1), ``b`` batch.

Features (``Features``), the front end of most ASR systems since the 1980s, computed with the field's tools:

    X[k, τ] = Σ_j w[j] x[τ H + j] e^{-2πi jk / N}     torch.stft: Hann window of N = n_fft samples, hop H
    P = |X|²                                          (f, t) power spectrum
    M = F P                                           (m, f) x (f, t) -> (m, t); F = librosa.filters.mel (Slaney)
    L = log max(M, 10^{-top_db/10} max M)             a floor top_db below the utterance's peak (librosa's
                                                      power_to_db does the same), so silence is not -∞
    Z[:, j] = (L[:, j] - mean_τ L[:, j]) / std(L)      per-band mean removed, one scale per utterance (CMVN)

At the defaults (16 kHz, 25 ms windows every 10 ms, 40 bands) one second of speech is 101 frames of 40 numbers.
The normalization uses the utterance alone, so a WAV file needs no statistics of the training set.

WAV files are read and written with ``soundfile``. A file at another sample rate is resampled with SciPy's
polyphase resampler (``scipy.signal.resample_poly``: upsample by p, FIR low-pass with a Kaiser window, keep
every q-th sample, p/q = target / rate reduced); several channels are averaged. An empty file, a silent one
(peak below -80 dBFS) and an unreadable one are ValueErrors that name the file.

A user's folder of WAV files and transcripts is read by ``seqlab.tasks.speech_folder``; with a speaker column it
is split by speaker (``split_by_speaker``: no test speaker is heard in training), otherwise by file.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from seqlab.tasks.base import MissingDependencyError

log = logging.getLogger("seqlab.tasks")

__all__ = [
    "TRANSCRIPTS",
    "Features",
    "Utterances",
    "check_audio_file",
    "read_wav",
    "soundfile_module",
    "split_by_speaker",
    "write_wav",
]

TRANSCRIPTS = "transcripts.txt"
SILENT_PEAK = 1e-4
"""-80 dBFS: a file whose loudest sample is quieter than this holds no speech to recognise."""
MIN_RATE = 4000
"""Hz: a file sampled more slowly than this holds no speech band (telephone audio is 8 kHz)."""
MIN_SECONDS = 0.1
"""A clip shorter than this is too short to hold a spoken word (the shortest last about 0.1-0.2 s)."""


def soundfile_module():
    """The ``soundfile`` module; a MissingDependencyError saying how to install it where it cannot load."""
    try:
        import soundfile
    except ImportError as e:  # a seqlab dependency, but its C library can be missing
        raise MissingDependencyError(
            f"reading WAV files needs soundfile and libsndfile: pip install soundfile ({e})"
        ) from e
    return soundfile


def check_audio_file(path: str | Path) -> Path:
    """``path`` as a Path when it is a file; a FileNotFoundError, or a ValueError for a folder, otherwise."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not an audio file")
    if not path.is_file():
        raise FileNotFoundError(f"audio file not found: {path}")
    return path


def read_wav(path: str | Path, sample_rate: int) -> np.ndarray:
    """The mono waveform (n,) float32 in [-1, 1] of an audio file, resampled to ``sample_rate``."""
    sf, path = soundfile_module(), check_audio_file(path)
    try:
        wave, rate = sf.read(str(path), dtype="float32", always_2d=True)  # (n, channels)
    except (RuntimeError, sf.LibsndfileError) as e:
        raise ValueError(f"{path} is not an audio file soundfile can read ({e})") from e
    if wave.shape[0] == 0:
        raise ValueError(f"{path} is empty: it holds no samples")
    _check_samples(path, wave, rate)
    channels, wave = wave, wave.mean(1)  # (n, channels) -> (n,): channels averaged
    if rate != sample_rate:
        wave = resample(wave, rate, sample_rate)
        log.info("resampled %s from %d Hz to %d Hz (scipy.signal.resample_poly)", path, rate, sample_rate)
    peak = float(np.abs(wave).max())
    if (
        peak < SILENT_PEAK <= (loudest := float(np.abs(channels).max()))
    ):  # each channel has sound, the mean not
        raise ValueError(
            f"{path}'s channels cancel when averaged to mono (peak {loudest:.2f} in a channel, {peak:.1e} in their "
            "mean: one is the other inverted); keep one channel of it, or fix the recording's wiring"
        )
    if peak < SILENT_PEAK:
        raise ValueError(
            f"{path} is silent (peak {peak:.1e}, below -80 dBFS): there is no speech in it to recognise"
        )
    return wave.astype(np.float32)


def _check_samples(path: Path, wave: np.ndarray, rate: int) -> None:
    """Refuse a file (n, channels) that cannot hold speech: non-finite samples (counted as stored, before any
    resampling spreads them), a rate below ``MIN_RATE``, fewer than ``MIN_SECONDS`` of audio."""
    bad = ~np.isfinite(wave).all(1)
    if bad.any():  # NaN or inf samples would make every feature of the file NaN
        raise ValueError(f"{path} holds {int(bad.sum())} non-finite (NaN or inf) samples")
    if rate < MIN_RATE:
        raise ValueError(
            f"{path} is sampled at {rate} Hz: speech needs at least {MIN_RATE} Hz (telephone audio is 8000 Hz)"
        )
    if wave.shape[0] < MIN_SECONDS * rate:
        raise ValueError(
            f"{path} is {wave.shape[0] / rate * 1000:.1f} ms long ({wave.shape[0]} samples at {rate} Hz): too "
            f"short to hold a spoken word; at least {MIN_SECONDS * 1000:.0f} ms expected"
        )


def resample(wave: np.ndarray, rate: int, target: int) -> np.ndarray:
    """(n,) at ``rate`` Hz -> (n target / rate,) at ``target`` Hz, polyphase (see the module docstring)."""
    from scipy.signal import resample_poly

    g = math.gcd(int(rate), int(target))
    return resample_poly(wave, target // g, rate // g).astype(np.float32)


def write_wav(path: str | Path, wave: np.ndarray, sample_rate: int) -> Path:
    """Write a mono waveform (n,) in [-1, 1] as 16-bit PCM."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile_module().write(str(path), np.clip(wave, -1.0, 1.0), sample_rate, subtype="PCM_16")
    return path


@lru_cache(maxsize=8)
def _mel_matrix(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float | None) -> Tensor:
    import librosa

    with warnings.catch_warnings():  # librosa's "Empty filters detected": said below in seqlab's words
        warnings.simplefilter("ignore", UserWarning)
        fb = librosa.filters.mel(sr=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)
    empty = int((fb.max(axis=1) == 0).sum())
    if empty:  # a band between two FFT bins: a feature that is 0 for every sound
        raise ValueError(
            f"n_mels={n_mels} leaves {empty} of its bands empty at n_fft={n_fft} ({n_fft // 2 + 1} frequency "
            f"bins) and sample_rate={sample_rate}: use fewer bands (n_mels), a larger n_fft, or a higher fmin"
        )
    return torch.from_numpy(fb).float()  # (m, f)


@dataclass(frozen=True)
class Features:
    """Log-mel features of a waveform (see the module docstring); ``features(wave)`` -> (t, m) float32.

    Examples::

        >>> feats = Features()(np.random.default_rng(0).normal(0, 0.1, 16000))
        >>> feats.shape
        torch.Size([101, 40])
    """

    sample_rate: int = 16000
    n_fft: int = 400
    """Window and FFT length in samples (25 ms at 16 kHz)."""
    hop_length: int = 160
    """Samples between frames (10 ms at 16 kHz)."""
    n_mels: int = 40
    fmin: float = 20.0
    fmax: float | None = None
    """Top of the highest band; None: the Nyquist frequency."""
    top_db: float = 60.0

    def __post_init__(self):
        for name in ("sample_rate", "n_fft", "hop_length", "n_mels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        nyquist = self.sample_rate / 2
        top = nyquist if self.fmax is None else self.fmax
        if not (
            isinstance(self.fmin, int | float)
            and isinstance(top, int | float)
            and 0 <= self.fmin < top <= nyquist
        ):
            raise ValueError(
                f"the bands must lie in 0 <= fmin < fmax <= sample_rate / 2 = {nyquist:g} Hz, got fmin={self.fmin!r}, "
                f"fmax={self.fmax!r}"
            )
        _mel_matrix(self.sample_rate, self.n_fft, self.n_mels, self.fmin, self.fmax)  # refuses empty bands

    def log_mel(self, wave: np.ndarray | Tensor) -> Tensor:
        """(n,) -> L (t, m), before normalization."""
        x = torch.as_tensor(np.asarray(wave, dtype=np.float32))
        if x.dim() != 1 or x.numel() == 0:
            raise ValueError(f"expected a non-empty mono waveform (n,), got shape {tuple(x.shape)}")
        if x.numel() < self.n_fft:  # one window at least
            x = torch.nn.functional.pad(x, (0, self.n_fft - x.numel()))
        window = torch.hann_window(self.n_fft)
        spec = torch.stft(x, self.n_fft, self.hop_length, window=window, center=True, return_complex=True)
        power = spec.abs().pow(2)  # (f, t)
        fb = _mel_matrix(self.sample_rate, self.n_fft, self.n_mels, self.fmin, self.fmax)
        mel = fb @ power  # (m, f) x (f, t) -> (m, t)
        floor = mel.max().clamp_min(1e-20) * 10 ** (-self.top_db / 10)
        return mel.clamp_min(floor).log().T  # (t, m)

    def __call__(self, wave: np.ndarray | Tensor) -> Tensor:
        """(n,) -> Z (t, m): log-mel, per-band mean removed, scaled by the utterance's standard deviation."""
        logmel = self.log_mel(wave)
        centred = logmel - logmel.mean(0, keepdim=True)  # (t, m)
        return centred / centred.std().clamp_min(1e-5)

    def frames_per_second(self) -> float:
        return self.sample_rate / self.hop_length


@dataclass
class Utterances:
    """Feature sequences of different lengths in one flat table, with their transcripts and speakers.

    ``frames`` (Σ t_i, m) float16, ``offsets`` (n + 1,): utterance i is ``frames[offsets[i]:offsets[i + 1]]``.
    """

    frames: Tensor
    offsets: Tensor
    texts: list[str]
    speakers: list[str]

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def lengths(self) -> Tensor:
        return self.offsets[1:] - self.offsets[:-1]  # (n,)

    def get(self, i: int) -> Tensor:
        return self.frames[int(self.offsets[i]) : int(self.offsets[i + 1])].float()  # (t_i, m)

    def batch(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """The utterances ``rows`` right-padded with zeros: x (b, t_max, m) float32, mask (b, t_max) bool."""
        seqs = [self.get(int(r)) for r in rows]
        lengths = torch.tensor([len(s) for s in seqs])
        x = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)  # (b, t_max, m)
        mask = torch.arange(x.size(1))[None, :] < lengths[:, None]  # (b, t_max)
        return x, mask

    def subset(self, rows: list[int] | Tensor) -> Utterances:
        rows = [int(r) for r in rows]
        seqs = [self.frames[int(self.offsets[r]) : int(self.offsets[r + 1])] for r in rows]
        return Utterances.of(seqs, [self.texts[r] for r in rows], [self.speakers[r] for r in rows])

    @staticmethod
    def of(seqs: list[Tensor], texts: list[str], speakers: list[str]) -> Utterances:
        lengths = torch.tensor([0] + [len(s) for s in seqs])
        m = seqs[0].shape[1] if seqs else 1
        frames = torch.cat([torch.as_tensor(s).half() for s in seqs]) if seqs else torch.zeros(0, m).half()
        return Utterances(frames, lengths.cumsum(0), list(texts), list(speakers))

    def save(self, folder: Path) -> None:
        np.save(folder / "frames.npy", self.frames.numpy())
        np.save(folder / "offsets.npy", self.offsets.numpy())
        meta = {"texts": self.texts, "speakers": self.speakers}
        (folder / "utterances.json").write_text(json.dumps(meta), encoding="utf-8")

    @staticmethod
    def load(folder: Path) -> Utterances:
        meta = json.loads((folder / "utterances.json").read_text(encoding="utf-8"))
        frames = torch.from_numpy(np.load(folder / "frames.npy", allow_pickle=False))
        offsets = torch.from_numpy(np.load(folder / "offsets.npy", allow_pickle=False))
        return Utterances(frames, offsets, meta["texts"], meta["speakers"])


def split_by_speaker(speakers: list[str], seed: int) -> dict[str, list[int]]:
    """Rows of train/val/test, 80/10/10: by speaker where every row names one (seeded), else by row.

    Rows that name a speaker beside rows that do not are an error (a split by row would put one speaker's
    utterances in training and test); named speakers too few for three splits are split by row, with a warning
    that the splits share speakers."""
    g = torch.Generator().manual_seed(seed)
    named = [bool(s) for s in speakers]
    if any(named) and not all(named):
        first = named.index(False)
        raise ValueError(
            f"{sum(named)} of the {len(speakers)} utterances name a speaker but utterance {first + 1} (in "
            f"{TRANSCRIPTS} order) does not: name every utterance's speaker, or none (then the split is by file)"
        )
    if all(named) and 0 < len(set(speakers)) < 3:
        log.warning(
            "%d speakers are too few to split by speaker (train, val and test need one each): splitting by "
            "file, so the splits share speakers",
            len(set(speakers)),
        )
    if all(speakers) and len(set(speakers)) >= 3:
        names = sorted(set(speakers))
        order = [names[i] for i in torch.randperm(len(names), generator=g).tolist()]
        n_val, n_test = max(1, round(0.1 * len(names))), max(1, round(0.1 * len(names)))
        test, val = set(order[:n_test]), set(order[n_test : n_test + n_val])
        parts = {"train": [], "val": [], "test": []}
        for i, s in enumerate(speakers):
            parts["test" if s in test else "val" if s in val else "train"].append(i)
        return parts
    order = torch.randperm(len(speakers), generator=g).tolist()
    cut_val, cut_test = int(0.8 * len(order)), int(0.9 * len(order))
    return {"train": order[:cut_val], "val": order[cut_val:cut_test], "test": order[cut_test:]}


def feature_settings(features: Features) -> dict:
    return asdict(features)
