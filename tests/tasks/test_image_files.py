"""Images and captions from files: mode conversion, letterboxing, captions files and their errors, and the
installed Tux Paint stamps."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from seqlab.tasks import image_files
from seqlab.tasks.base import MissingDependencyError
from seqlab.tasks.image_files import (
    TUXPAINT_DIR,
    TUXPAINT_INSTALL,
    load_image,
    load_images,
    read_captions_file,
    tuxpaint_stamps,
)

RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)


def save(tmp_path: Path, name: str, image: Image.Image, **kwargs) -> Path:
    path = tmp_path / name
    image.save(path, **kwargs)
    return path


def test_rgba_and_la_are_composited_on_white(tmp_path):
    rgba = np.zeros((2, 3, 4), dtype=np.uint8)  # (H, W, RGBA)
    rgba[:, 0] = (*RED, 0)  # fully transparent red -> white
    rgba[:, 1] = (*BLUE, 255)  # opaque blue
    rgba[:, 2] = (*BLUE, 128)  # half blue over white
    x = load_image(save(tmp_path, "a.png", Image.fromarray(rgba, "RGBA")))
    assert x.dtype == torch.uint8 and x.shape == (3, 2, 3)
    assert x[:, 0, 0].tolist() == list(WHITE) and x[:, 0, 1].tolist() == list(BLUE)
    half = round(255 * (1 - 128 / 255))  # 127: the white that shows through in R and G
    assert x[:, 0, 2].tolist() == pytest.approx([half, half, 255], abs=1)
    la = np.array([[[0, 0], [60, 255]]], dtype=np.uint8)  # (1, 2, LA): transparent black, opaque grey 60
    y = load_image(save(tmp_path, "la.png", Image.fromarray(la, "LA")))
    assert y[:, 0, 0].tolist() == list(WHITE) and y[:, 0, 1].tolist() == [60, 60, 60]


def test_palette_and_greyscale_images(tmp_path):
    indices = np.array([[0, 1, 1]], dtype=np.uint8)
    palette = Image.fromarray(indices, "P")
    palette.putpalette([*RED, *BLUE] + [0] * (3 * 254))
    x = load_image(save(tmp_path, "p.png", palette))
    assert x[:, 0].T.tolist() == [list(RED), list(BLUE), list(BLUE)]
    transparent = load_image(save(tmp_path, "pt.png", palette, transparency=0))  # index 0 transparent
    assert transparent[:, 0].T.tolist() == [list(WHITE), list(BLUE), list(BLUE)]
    grey = load_image(
        save(tmp_path, "l.png", Image.fromarray(np.array([[0, 100, 255]], dtype=np.uint8), "L"))
    )
    assert grey[:, 0].T.tolist() == [[0] * 3, [100] * 3, [255] * 3]
    deep = Image.fromarray(np.array([[0, 100 * 257, 65535]], dtype=np.uint16))  # 16-bit, mode I;16
    assert load_image(save(tmp_path, "i16.png", deep))[0, 0].tolist() == [0, 100, 255]  # scaled, not clipped
    gif = load_image(save(tmp_path, "g.gif", Image.new("RGB", (4, 5), RED)))
    assert gif.shape == (3, 5, 4) and (gif[0] == 255).all()


def test_letterboxing_keeps_the_aspect_ratio_and_pads_with_white(tmp_path):
    wide = save(tmp_path, "wide.png", Image.new("RGB", (40, 20), RED))  # width 40, height 20
    assert load_image(wide).shape == (3, 20, 40)
    x = load_image(wide, size=16)  # -> 16 x 8, rows 4..11
    assert x.shape == (3, 16, 16)
    red_rows = (x[1] == 0).all(dim=1)  # (16,) rows with no green at all: the image
    assert red_rows.nonzero().flatten().tolist() == list(range(4, 12))
    assert (x[:, :4] == 255).all() and (x[:, 12:] == 255).all()
    tall = load_image(save(tmp_path, "tall.png", Image.new("RGB", (10, 30), BLUE)), size=12)  # -> 4 x 12
    blue_cols = (tall[0] == 0).all(dim=0)  # (12,) columns with no red: the image
    assert blue_cols.nonzero().flatten().tolist() == [4, 5, 6, 7]
    stacked = load_images([wide, tmp_path / "tall.png"], size=16)
    assert stacked.shape == (2, 3, 16, 16) and torch.equal(stacked[0], x)
    assert load_images([], size=8).shape == (0, 3, 8, 8)


def test_unreadable_files_raise_value_errors_naming_the_path(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"image file .*nothing\.png does not exist"):
        load_image(tmp_path / "nothing.png")
    text = tmp_path / "notes.png"
    text.write_text("not a picture\n")
    with pytest.raises(ValueError, match=r"notes\.png is not an image"):
        load_image(text)
    with pytest.raises(ValueError, match="size must be an integer >= 1"):
        load_image(text, size=0)
    empty = save(tmp_path, "ok.png", Image.new("RGB", (3, 3)))
    monkeypatch.setattr(
        image_files.Image, "open", lambda path: Image.new("RGB", (0, 5))
    )  # Pillow won't write one
    with pytest.raises(ValueError, match=r"ok\.png holds an empty image of size 0x5"):
        load_image(empty)


# ---- captions files ------------------------------------------------------------------------------------


@pytest.fixture
def pictures(tmp_path) -> Path:
    folder = tmp_path / "pics"
    folder.mkdir()
    for name, colour in (("a.png", RED), ("b.png", BLUE)):
        Image.new("RGB", (4, 4), colour).save(folder / name)
    return folder


def test_csv_captions_with_relative_and_absolute_paths(tmp_path, pictures):
    absolute = pictures / "b.png"
    (tmp_path / "caps.csv").write_text(
        "id,image,caption,source\n"
        '1,pics/a.png,"a red square, small",x\n'
        "2,pics/a.png,  another caption for a  ,y\n"
        f"3,{absolute},a blue square,z\n"
    )
    rows = read_captions_file(tmp_path / "caps.csv")
    assert rows == [
        (pictures / "a.png", "a red square, small"),
        (pictures / "a.png", "another caption for a"),
        (absolute, "a blue square"),
    ]
    assert (load_image(rows[0][0])[0] == 255).all()


def test_jsonl_captions(tmp_path, pictures):
    lines = [
        {"image": "pics/a.png", "caption": "red", "extra": 1},
        {"image": "pics/b.png", "caption": "blue"},
    ]
    for name in ("caps.jsonl", "caps.json"):
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")
        assert read_captions_file(tmp_path / name) == [
            (pictures / "a.png", "red"),
            (pictures / "b.png", "blue"),
        ]


def test_captions_file_errors(tmp_path, pictures):
    missing = tmp_path / "missing.csv"
    missing.write_text(
        "image,caption\n" + "".join(f"pics/gone{i}.png,cap\n" for i in range(7)) + "pics/a.png,ok\n"
    )
    with pytest.raises(
        ValueError, match=r"7 of the images it names do not exist: .*gone0\.png.*gone4\.png and 2 more"
    ):
        read_captions_file(missing)
    (tmp_path / "cols.csv").write_text("file,caption\npics/a.png,x\n")
    with pytest.raises(
        ValueError, match=r"lacks column\(s\) \['image'\]; found columns \['file', 'caption'\]"
    ):
        read_captions_file(tmp_path / "cols.csv")
    (tmp_path / "keys.jsonl").write_text('{"image": "pics/a.png", "text": "x"}\n')
    with pytest.raises(
        ValueError, match=r"line 1: the object lacks key\(s\) \['caption'\]; found keys \['image', 'text'\]"
    ):
        read_captions_file(tmp_path / "keys.jsonl")
    (tmp_path / "blank.csv").write_text("image,caption\npics/a.png,   \n")
    with pytest.raises(ValueError, match="line 2: the caption must be non-empty"):
        read_captions_file(tmp_path / "blank.csv")
    (tmp_path / "caps.txt").write_text("pics/a.png\tx\n")
    with pytest.raises(
        ValueError, match=r"unknown captions file type '\.txt'; expected \.csv, \.jsonl or \.json"
    ):
        read_captions_file(tmp_path / "caps.txt")
    (tmp_path / "array.json").write_text('[{"image": "pics/a.png", "caption": "x"}]\n')
    with pytest.raises(ValueError, match="expected a JSON object per line, got list"):
        read_captions_file(tmp_path / "array.json")


# ---- Tux Paint -----------------------------------------------------------------------------------------


def test_missing_tuxpaint_folder_says_how_to_install(tmp_path):
    with pytest.raises(
        MissingDependencyError, match=r"tuxpaint-stamps-default .*apt-get install -y --no-install-recommends"
    ):
        tuxpaint_stamps(tmp_path / "no-stamps")


@pytest.mark.skipif(
    not Path(TUXPAINT_DIR).is_dir(), reason=f"Tux Paint stamps not installed: {TUXPAINT_INSTALL}"
)
def test_installed_tuxpaint_stamps():
    stamps = tuxpaint_stamps()
    assert 100 <= len(stamps) < 1000  # ~785 captioned stamps in tuxpaint-stamps-default 2024
    assert [p for p, _ in stamps] == sorted(p for p, _ in stamps)
    assert all(p.suffix == ".png" and p.with_suffix(".txt").is_file() for p, _ in stamps)
    assert not any(p.stem.endswith("_mirror") for p, _ in stamps)  # mirrored variants carry no caption
    captions = {p.relative_to(TUXPAINT_DIR).as_posix(): c for p, c in stamps}
    assert captions.get("animals/amphibians/frog.png", "A frog.") == "A frog."
    # first lines only: English text, never a translation line such as 'fr.utf8=...'
    assert all(c and ".utf8=" not in c and c == c.strip() for c in captions.values())
    assert sum(any(ch.isalpha() for ch in c) for c in captions.values()) == len(captions)
    images = load_images([p for p, _ in stamps[:3]], size=32)
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.uint8


def test_an_image_past_pillows_pixel_limit_is_a_value_error(tmp_path, monkeypatch):
    """Pillow refuses images past MAX_IMAGE_PIXELS (a decompression bomb); seqlab names the file instead of a
    traceback (the limit is lowered here so that a small image stands for a 20000 x 20000 one)."""
    path = tmp_path / "huge.png"
    Image.new("RGB", (40, 40)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ValueError, match=r"huge\.png is too large to read safely .* downscale it first"):
        image_files._open_rgb(path)


def test_an_image_past_pillows_warning_loads_with_a_warning_naming_it(tmp_path, monkeypatch, caplog, recwarn):
    """Between MAX_IMAGE_PIXELS and twice it Pillow only warns (DecompressionBombWarning, printed raw); seqlab
    reads the image and says which file it was, once, in its own log."""
    path = tmp_path / "big.png"
    Image.new("RGB", (15, 10)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 150 pixels: past the warning, under the error
    with caplog.at_level(logging.WARNING, logger="seqlab.tasks"):
        image = image_files._open_rgb(path)
    assert image.size == (15, 10)
    assert not [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)]
    assert "big.png is 15x10 (" in caplog.text and "past Pillow's" in caplog.text
