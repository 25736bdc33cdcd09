"""Speech data and tasks: log-mel features against librosa, WAV reading (resampling, silence, empty files), a
user's folder, CTC decoding on posteriors whose answer is known, error rates, and the espeak-ng corpus (its
held-out voices, its cache, its batches)."""

import shutil

import numpy as np
import pytest
import torch

from seqlab.tasks import create_task, speech_folder
from seqlab.tasks.base import MissingDependencyError
from seqlab.tasks.speech_data import Features, Utterances, read_wav, split_by_speaker, write_wav
from seqlab.tasks.speech_decode import beam_search, error_rates, greedy_decode
from seqlab.tasks.speech_folder import MAX_SECONDS, read_speech_folder

needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="needs espeak-ng: apt-get install -y espeak-ng"
)
TONES = {"a": 300.0, "b": 900.0, "c": 2000.0, " ": None}


def tone_speech(text: str, sr: int = 16000, seconds: float = 0.12, seed: int = 0) -> np.ndarray:
    """A made-up language: each character a tone (a space a pause), with a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(sr * seconds)) / sr
    parts = [np.zeros(int(0.05 * sr))]
    for ch in text:
        f = TONES[ch]
        parts.append(np.zeros_like(t) if f is None else 0.5 * np.sin(2 * np.pi * f * t))
    wave = np.concatenate([*parts, np.zeros(int(0.05 * sr))])
    return (wave + rng.normal(0, 0.01, wave.shape)).astype(np.float32)


def tone_folder(path, texts, speakers=None, sr=16000):
    path.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, text in enumerate(texts):
        write_wav(path / f"u{i}.wav", tone_speech(text, sr, seed=i), sr)
        lines.append(f"u{i}.wav\t{text}" + (f"\t{speakers[i]}" if speakers else ""))
    (path / "transcripts.txt").write_text(
        "# file, text, speaker\n" + "\n".join(lines) + "\n", encoding="utf-8"
    )
    return path


# ---- features and WAV files ---------------------------------------------------------------------------------


def test_log_mel_matches_librosa():
    librosa = pytest.importorskip("librosa")
    wave = np.random.default_rng(0).normal(0, 0.1, 8000).astype(np.float32)
    f = Features(n_mels=24)
    ref = librosa.feature.melspectrogram(
        y=wave, sr=16000, n_fft=400, hop_length=160, n_mels=24, fmin=20.0, power=2.0, pad_mode="reflect"
    )  # (m, t)
    ours = f.log_mel(wave).exp().T  # (m, t), above the floor everywhere for white noise
    torch.testing.assert_close(ours, torch.from_numpy(ref).float(), rtol=1e-4, atol=1e-6)
    z = f(wave)
    assert z.shape == (51, 24)
    torch.testing.assert_close(z.mean(0), torch.zeros(24), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_mels": 200}, r"n_mels=200 leaves 18 of its bands empty at n_fft=400 \(201 frequency bins\)"),
        ({"fmin": 9000.0}, r"0 <= fmin < fmax <= sample_rate / 2 = 8000 Hz, got fmin=9000.0"),
        ({"fmax": 22050.0}, r"got fmin=20.0, fmax=22050.0"),
        ({"fmin": -1.0}, "0 <= fmin"),
    ],
)
def test_bands_that_cannot_hold_sound_are_refused(kwargs, match):
    """An empty mel band is a feature that is 0 for every sound (librosa only warned)."""
    pytest.importorskip("librosa")
    with pytest.raises(ValueError, match=match):
        Features(**kwargs)


def test_wav_round_trip_resampling_and_channels(tmp_path):
    sr = 22050
    t = np.arange(sr) / sr
    tone = 0.5 * np.sin(2 * np.pi * 1000 * t)
    write_wav(tmp_path / "mono.wav", tone, sr)
    wave = read_wav(tmp_path / "mono.wav", 16000)
    assert wave.dtype == np.float32 and abs(len(wave) - 16000) <= 1
    peak_hz = np.argmax(np.abs(np.fft.rfft(wave))) * 16000 / len(wave)
    assert abs(peak_hz - 1000) < 5  # the tone survives resampling
    import soundfile as sf

    sf.write(tmp_path / "stereo.wav", np.stack([tone, -0.5 * tone], 1), sr)
    stereo = read_wav(tmp_path / "stereo.wav", sr)
    np.testing.assert_allclose(stereo, 0.25 * tone, atol=1e-3)  # the channels' mean
    sf.write(tmp_path / "cancel.wav", np.stack([tone, -tone], 1), sr)  # loud channels, a silent mean
    with pytest.raises(ValueError, match=r"channels cancel when averaged to mono \(peak 0\.50 in a channel"):
        read_wav(tmp_path / "cancel.wav", sr)


def test_bad_audio_files_say_what_is_wrong(tmp_path):
    write_wav(tmp_path / "silent.wav", np.zeros(1600), 16000)
    with pytest.raises(ValueError, match="silent"):
        read_wav(tmp_path / "silent.wav", 16000)
    write_wav(tmp_path / "empty.wav", np.zeros(0), 16000)
    with pytest.raises(ValueError, match="empty"):
        read_wav(tmp_path / "empty.wav", 16000)
    (tmp_path / "text.wav").write_text("not audio", encoding="utf-8")
    with pytest.raises(ValueError, match="not an audio file"):
        read_wav(tmp_path / "text.wav", 16000)
    with pytest.raises(FileNotFoundError):
        read_wav(tmp_path / "missing.wav", 16000)


def test_utterances_pad_and_subset():
    seqs = [torch.randn(n, 3) for n in (4, 2, 5)]
    u = Utterances.of(seqs, ["a", "b", "c"], ["s", "t", "s"])
    x, mask = u.batch(torch.tensor([1, 2]))
    assert x.shape == (2, 5, 3) and mask.sum(1).tolist() == [2, 5]
    torch.testing.assert_close(x[0, :2], seqs[1].half().float())
    assert (x[0, 2:] == 0).all()
    sub = u.subset([2, 0])
    assert sub.texts == ["c", "a"] and sub.lengths.tolist() == [5, 4]


# ---- a user's folder ----------------------------------------------------------------------------------------


def test_folder_reads_and_splits_by_speaker(tmp_path):
    texts = ["ab", "ba", "abc", "c", "ca", "bb", "a c", "cab", "bc", "ac", "cc", "aa"]
    speakers = [f"spk{i % 6}" for i in range(12)]
    folder = tone_folder(tmp_path / "f", texts, speakers, sr=8000)  # read at 16 kHz: resampled
    utts = read_speech_folder(folder, Features())
    assert utts.texts == texts and len(utts) == 12
    parts = split_by_speaker(utts.speakers, seed=0)
    heard = {utts.speakers[i] for i in parts["train"]}
    assert not heard & {utts.speakers[i] for i in parts["test"] + parts["val"]}
    assert sorted(i for rows in parts.values() for i in rows) == list(range(12))


def test_folder_errors_name_the_line(tmp_path):
    folder = tone_folder(tmp_path / "f", ["ab", "ba"])
    (folder / "transcripts.txt").write_text("u0.wav ab\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 1: expected FILE.wav<TAB>transcript"):
        read_speech_folder(folder, Features())
    (folder / "transcripts.txt").write_text("u0.wav\tab\nu9.wav\tba\n", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="line 2"):
        read_speech_folder(folder, Features())
    with pytest.raises(FileNotFoundError, match=r"transcripts\.txt"):
        read_speech_folder(tmp_path, Features())


def test_tasks_on_a_folder(tmp_path):
    texts = ["ab", "ba", "abc", "c", "ca", "bb", "a c", "cab", "bc", "ac", "cc", "aa"] * 2
    folder = tone_folder(tmp_path / "f", texts)
    ctc = create_task("speech_ctc", source="folder", path=str(folder), batch_size=4)
    assert ctc.vocabulary == ["<blank>", " ", "a", "b", "c"]
    b = ctc.get_batch("train", 3)
    assert b["x"].shape[0] == 4 and b["targets"].shape[0] == 4
    assert ctc.decode(ctc.encode("a c")) == "a c"
    kw = create_task("keywords", source="folder", path=str(folder), batch_size=4)
    assert kw.n_classes == 12 and kw.model_overrides()["n_outputs"] == 12
    with pytest.raises(ValueError, match="needs path=FOLDER"):
        create_task("keywords", source="folder")


def _no_audio_read(monkeypatch):
    """Any WAV file read from here on is a test failure: the folder's checks come before the audio."""

    def read_wav(path, sample_rate):
        raise AssertionError(f"{path} was read before the folder's files were checked")

    monkeypatch.setattr(speech_folder, "read_wav", read_wav)


def test_missing_files_are_named_together_before_any_audio_is_read(tmp_path, monkeypatch):
    folder = tone_folder(tmp_path / "f", ["ab", "ba", "c"] * 4)
    for i in (3, 7, 9, 10, 11):  # the last lines too: each was found only after every file before it was read
        (folder / f"u{i}.wav").unlink()
    (folder / "u5.wav").unlink()
    (folder / "u5.wav").mkdir()  # a folder of that name is not a recording either
    _no_audio_read(monkeypatch)
    with pytest.raises(FileNotFoundError) as e:
        read_speech_folder(folder, Features())
    said = str(e.value)
    assert "6 of the 12 WAV files it names are not there" in said
    assert f"line 5: {folder / 'u3.wav'} does not exist" in said  # line 1 is the comment
    assert f"line 7: {folder / 'u5.wav'} is a folder, not a file" in said
    assert "line 12" in said and "; and 1 more" in said and "line 13" not in said  # the first 5 named


def _long_folder(path, seconds: dict[int, float], n=12, sr=8000):
    """``tone_folder`` with the recordings ``seconds`` names (row: length in seconds) made that long."""
    folder = tone_folder(path, ["ab", "ba", "c"] * (n // 3))
    for i, s in seconds.items():
        t = np.arange(int(s * sr)) / sr
        write_wav(folder / f"u{i}.wav", (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), sr)
    return folder


def test_recordings_longer_than_max_seconds_are_refused_before_any_audio_is_read(tmp_path, monkeypatch):
    """A 30-minute recording was trained on: F.ctc_loss asked for 517 GB. Refused from the files' headers."""
    folder = _long_folder(tmp_path / "f", {2: MAX_SECONDS + 1})  # at the default limit
    _no_audio_read(monkeypatch)
    with pytest.raises(ValueError) as e:
        read_speech_folder(folder, Features())
    said = str(e.value)
    assert f"1 of its 12 recordings is longer than max_seconds={MAX_SECONDS:g} s" in said
    assert f"line 4: u2.wav ({MAX_SECONDS + 1:,.1f} s)" in said
    assert "cut long recordings into utterances" in said and "--task.max_seconds=" in said
    monkeypatch.undo()
    assert len(read_speech_folder(folder, Features(), max_seconds=MAX_SECONDS + 2)) == 12  # raised: read


def test_the_tasks_take_max_seconds_and_name_every_long_recording(tmp_path):
    folder = _long_folder(tmp_path / "f", {i: 1.5 for i in range(1, 8)})
    says = (
        r"7 of its 12 recordings are longer than max_seconds=1 s \(line 3: u1.wav \(1.5 s\).*; and 2 more\)"
    )
    for name in ("speech_ctc", "keywords"):
        with pytest.raises(ValueError, match=says):
            create_task(name, source="folder", path=str(folder), max_seconds=1)
    task = create_task("speech_ctc", source="folder", path=str(folder), max_seconds=2.0, batch_size=4)
    assert task.describe()["max_seconds"] == 2.0 and sum(task.n_utterances.values()) == 12
    for bad in (0, 0.05, -1, "long", True, None, float("nan")):
        with pytest.raises(ValueError, match=r"max_seconds must be a number of seconds above 0.1"):
            create_task("speech_ctc", source="folder", path=str(folder), max_seconds=bad)


# ---- decoding and scores ------------------------------------------------------------------------------------


def test_greedy_collapses_repeats_then_drops_blanks():
    path = [0, 1, 1, 0, 1, 2, 2, 0, 0, 3]  # ∅ a a ∅ a b b ∅ ∅ c -> a a b c
    log_probs = torch.nn.functional.one_hot(torch.tensor([path]), 4).float().mul(10).log_softmax(-1)
    assert greedy_decode(log_probs) == [[1, 1, 2, 3]]
    assert greedy_decode(log_probs, torch.tensor([3])) == [[1]]  # only the real frames


def test_beam_search_finds_the_sequence_the_best_path_misses():
    # p(∅) = 0.6, p(a) = 0.4 at both frames: best path ∅∅ -> "" (0.36); "a" = aa + a∅ + ∅a = 0.64
    log_probs = torch.tensor([[[0.6, 0.4], [0.6, 0.4]]]).log()
    assert greedy_decode(log_probs) == [[]]
    assert beam_search(log_probs, beam_size=4) == [[1]]


def test_beam_search_sums_paths_over_three_frames():
    # brute force over all 3^3 paths gives the most probable collapsed sequence; the beam must find it
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.35, 0.15], [0.45, 0.1, 0.45]])
    totals: dict[tuple, float] = {}
    for path in torch.cartesian_prod(*[torch.arange(3)] * 3).tolist():
        seq = tuple(k for i, k in enumerate(path) if k != 0 and (i == 0 or path[i - 1] != k))
        totals[seq] = totals.get(seq, 0.0) + float(probs[0, path[0]] * probs[1, path[1]] * probs[2, path[2]])
    best = max(totals, key=totals.get)
    got = beam_search(probs[None].log(), beam_size=8)[0]
    assert tuple(got) == best and totals[best] > totals[tuple(greedy_decode(probs[None].log())[0])]
    peaked = torch.nn.functional.one_hot(torch.tensor([[1, 0, 2, 2]]), 3).float().mul(20).log_softmax(-1)
    assert beam_search(peaked) == greedy_decode(peaked) == [[1, 2]]


def test_decoders_refuse_lengths_past_the_frames_and_bad_beams():
    """The beam search's decoder reads as many frames of memory as it is told: more than t read past the array."""
    log_probs = torch.randn(2, 6, 5).log_softmax(-1)
    for bad in (
        torch.tensor([6, 600]),
        torch.tensor([-2, 3]),
        torch.tensor([3]),
        torch.tensor([2.0, 3.0]),
        [3, 3],
    ):
        for decode in (greedy_decode, beam_search):
            with pytest.raises(ValueError, match=r"lengths must be \(b,\) = \(2,\) integers in \[0, t = 6\]"):
                decode(log_probs, bad)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="beam_size must be an integer >= 1"):
            beam_search(log_probs, beam_size=bad)
    with pytest.raises(ValueError, match=r"expected log_probs \(b, t, v\) as floats"):
        greedy_decode(torch.zeros(2, 6, dtype=torch.long))
    assert (
        beam_search(log_probs, torch.tensor([6, 0]))[1]
        == greedy_decode(log_probs, torch.tensor([6, 0]))[1]
        == []
    )


def test_error_rates_through_jiwer():
    scores = error_rates(["seven three", "one"], ["seven tree", ""])
    assert scores["wer"] == pytest.approx(2 / 3)  # 'tree' substituted, 'one' deleted
    assert scores["cer"] == pytest.approx(4 / 14)  # 'h' deleted, 'o', 'n', 'e' deleted
    with pytest.raises(ValueError, match="non-empty reference"):
        error_rates([""], ["a"])


# ---- the espeak-ng corpus -----------------------------------------------------------------------------------


def test_missing_espeak_names_the_install(monkeypatch, tmp_path):
    import seqlab.tasks.speech_corpus as corpus

    monkeypatch.setattr(corpus.shutil, "which", lambda name: None)
    with pytest.raises(MissingDependencyError, match="apt-get install -y espeak-ng"):
        create_task("keywords", n_train=4, n_eval=2, cache_dir=str(tmp_path))


@needs_espeak
def test_a_tiny_corpus_held_out_voices_cache_and_batches(tmp_path, monkeypatch):
    kw = dict(n_train=12, n_eval=4, batch_size=4, cache_dir=str(tmp_path))
    task = create_task("speech_ctc", **kw)
    voices = {s: {v.split("+")[1] for v in task.data[s].speakers} for s in ("train", "val", "test")}
    assert not voices["train"] & voices["test"] and not voices["train"] & voices["val"]
    assert all(2 <= len(t.split()) <= 5 for t in task.data["train"].texts)
    assert str(tmp_path) in task.corpus
    b1, b2 = task.get_batch("train", 2), task.get_batch("train", 2)
    assert all(torch.equal(b1[k], b2[k]) for k in b1)  # pure in (seed, split, index)
    assert b1["x"].shape[-1] == 40 and b1["mask"][:, 0].all()
    words = create_task("keywords", **kw)
    assert words.data["train"].texts[:3] == ["zero", "one", "two"] and words.n_classes == 20
    import seqlab.tasks.speech_corpus as corpus

    monkeypatch.setattr(corpus, "build_corpus", lambda *a: pytest.fail("the cached corpus was rebuilt"))
    again = create_task("speech_ctc", **kw)
    assert again.data["test"].texts == task.data["test"].texts


def test_a_folders_features_are_computed_on_one_thread_and_the_count_restored(tmp_path):
    folder = tone_folder(tmp_path / "f", ["ab", "ba", "c"] * 4)
    features, seen = Features(), []

    class Recorded:  # the same features, noting the thread count each file is computed on
        sample_rate = features.sample_rate

        def __call__(self, wave):
            seen.append(torch.get_num_threads())
            return features(wave)

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        read_speech_folder(folder, Recorded())
        assert seen == [1] * 12 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
