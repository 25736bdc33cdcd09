"""Settings that shape one data source only are refused, by name and before any data is read or generated, when
given for the other (speech: the generated corpus's sizes for a folder, max_seconds for the corpus; video: the
generated clips' settings for a folder, event_prob for the long setting and early for the short one); their
defaults pass, so a run's saved description rebuilds the same task."""

import json

import pytest
import torch
from test_speech_task import tone_folder, tone_speech  # the same folder (pytest puts it on sys.path)
from test_video_task import _folder as clip_folder

import seqlab.tasks.clip_files as clip_files
import seqlab.tasks.clips as clips
import seqlab.tasks.speech as speech
import seqlab.tasks.speech_corpus as speech_corpus
from seqlab.tasks import create_task
from seqlab.tasks.source_settings import is_given
from seqlab.tasks.speech_data import Features, Utterances

TEXTS = ["ab", "ba", "c"] * 4


@pytest.fixture
def no_data_read(monkeypatch):
    """Reading a speech folder or a clip folder, or building a speech corpus or clips, fails the test: the
    refusals come first."""

    def fail(*args, **kwargs):
        raise AssertionError("data was read or generated before the settings were checked")

    monkeypatch.setattr(speech, "read_speech_folder", fail)
    monkeypatch.setattr(speech_corpus, "load_corpus", fail)
    monkeypatch.setattr(clip_files, "read_clip_folder", fail)
    monkeypatch.setattr(clips, "make_clips", fail)


def _rebuilt(task):
    """The task rebuilt from its description the way ``seqlab eval`` and ``--resume`` read it back: through
    JSON, without its name and its derived numbers."""
    saved = json.loads(json.dumps(task.describe()))
    derived = {*type(task).derived, "name", "mean", "std", "vocabulary"}
    return create_task(task.name, **{k: v for k, v in saved.items() if k not in derived})


def _same(a, b) -> bool:
    return json.loads(json.dumps(a.describe())) == json.loads(json.dumps(b.describe()))


# ---- speech --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "setting", "value"),
    [
        ("keywords", "n_train", 500),
        ("keywords", "n_eval", 50),
        ("keywords", "snrs", [None, 10]),
        ("keywords", "cache_dir", "/tmp/corpora"),
        ("keywords", "jobs", 4),
        ("speech_ctc", "n_train", 500),
        ("speech_ctc", "min_digits", 3),
        ("speech_ctc", "max_digits", 7),
        ("speech_ctc", "jobs", 1),
    ],
)
def test_a_speech_folder_refuses_the_generated_corpus_settings(tmp_path, no_data_read, name, setting, value):
    with pytest.raises(ValueError) as e:
        create_task(name, source="folder", path=str(tmp_path), **{setting: value})
    said = str(e.value)
    assert said.startswith(
        f"task.{setting}={value!r} does not apply to source='folder': task.{setting} sets "
    )
    assert "the folder's own recordings are the data" in said and f"leave task.{setting} unset" in said


def test_several_speech_settings_are_named_in_one_message(tmp_path, no_data_read):
    with pytest.raises(ValueError) as e:
        create_task("speech_ctc", source="folder", path=str(tmp_path), n_train=500, snrs=[20], max_digits=9)
    said = str(e.value)
    assert said.startswith(
        "task.n_train=500, task.max_digits=9 and task.snrs=[20] do not apply to source='folder'"
    )
    assert said.endswith("so they would change nothing; leave them unset")


@pytest.mark.parametrize("name", ["keywords", "speech_ctc"])
def test_the_generated_corpus_refuses_max_seconds(no_data_read, name):
    with pytest.raises(
        ValueError, match=r"^task.max_seconds=30 does not apply to source='generated': task.max"
    ):
        create_task(name, max_seconds=30)


def test_speech_defaults_pass_and_a_folder_run_rebuilds_from_its_description(tmp_path):
    folder = tone_folder(tmp_path / "f", TEXTS)
    for name in ("keywords", "speech_ctc"):
        task = create_task(name, source="folder", path=str(folder), n_train=3000, jobs=2, batch_size=4)
        again = _rebuilt(task)
        assert _same(task, again) and again.data["test"].texts == task.data["test"].texts


def _fake_corpus(monkeypatch, texts):
    """A generated corpus of tone utterances in place of espeak-ng's, 6/3/3 per split."""
    feats = Features()
    utts = Utterances.of([feats(tone_speech("ab", seed=i)) for i in range(12)], texts, [""] * 12)
    splits = {"train": list(range(6)), "val": [6, 7, 8], "test": [9, 10, 11]}
    monkeypatch.setattr(speech_corpus, "load_corpus", lambda *a: (utts, splits, None))


def test_a_generated_speech_run_rebuilds_from_its_description(monkeypatch):
    _fake_corpus(monkeypatch, ["one two", "three"] * 6)
    task = create_task("speech_ctc", n_train=6, n_eval=3, snrs=[None, 5], batch_size=4)
    assert task.max_seconds == 60.0  # described at its default: passes the corpus's check
    assert _same(task, _rebuilt(task))


# ---- video ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value"),
    [("setting", "long"), ("n_objects", 2), ("sprites", "digits"), ("event_prob", 0.5), ("n_train", 64)],
)
def test_a_clip_folder_refuses_the_generated_clips_settings(tmp_path, no_data_read, setting, value):
    with pytest.raises(ValueError) as e:
        create_task("video", source="folder", path=str(tmp_path), **{setting: value})
    said = str(e.value)
    assert said.startswith(
        f"task.{setting}={value!r} does not apply to source='folder': task.{setting} sets "
    )
    assert "the folder's own clips are the data" in said and f"leave task.{setting} unset" in said


def test_the_long_setting_refuses_event_prob_and_make_clips_the_other_settings_own(no_data_read):
    with pytest.raises(
        ValueError, match=r"^task.event_prob=0.1 does not apply to setting='long': task.event_"
    ):
        create_task("video", setting="long", event_prob=0.1)
    with pytest.raises(
        ValueError, match=r"^event_prob=0.5 does not apply to setting='long': event_prob sets"
    ):
        clips.ClipSettings(setting="long", event_prob=0.5)
    with pytest.raises(ValueError, match=r"^early=6 does not apply to setting='short': early sets how many"):
        clips.ClipSettings(early=6)
    assert clips.ClipSettings(setting="long", early=6).early == 6  # where they apply, they are taken


def test_video_runs_rebuild_from_their_descriptions(tmp_path):
    folder = clip_folder(tmp_path)
    for sizes in ({}, {"frame_size": 12, "channels": 3}):  # a folder's own sizes are described, and apply
        task = create_task("video", source="folder", path=str(folder), batch_size=4, **sizes)
        again = _rebuilt(task)
        assert _same(task, again) and torch.equal(again.clips["test"].frames, task.clips["test"].frames)
    task = create_task("video", setting="long", n_frames=12, frame_size=24, n_train=8, n_eval=4)
    assert _same(task, _rebuilt(task))


def test_given_means_other_than_the_default():
    assert not is_given(3000, 3000) and not is_given(60, 60.0) and not is_given(None, None)
    assert is_given(True, 1) and is_given([10], None) and is_given(torch.ones(2), 1)
