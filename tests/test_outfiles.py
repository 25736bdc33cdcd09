"""The figure commands never overwrite a file: the user's --out is refused when it exists, the default is
numbered past earlier ones, and every refusal comes before the command's work."""

import pytest

from seqlab.cli import main
from seqlab.outfiles import fresh_file


def test_fresh_file_rules(tmp_path):
    default = str(tmp_path / "viz" / "positions.png")
    assert fresh_file(None, default) is None  # no file asked for (forecast without --out)
    assert fresh_file(default, default) == default
    (tmp_path / "viz").mkdir()
    (tmp_path / "viz" / "positions.png").write_bytes(b"earlier")
    (tmp_path / "viz" / "positions-2.png").write_bytes(b"earlier too")
    assert fresh_file(default, default) == str(tmp_path / "viz" / "positions-3.png")
    notes = tmp_path / "notes.pdf"
    notes.write_text("mine", encoding="utf-8")
    for out, message in [
        (str(notes), "notes.pdf exists; seqlab does not overwrite files"),
        (str(tmp_path / "viz"), "is a folder; give a file name in it"),
        (str(notes / "x.png"), "notes.pdf is a file, not a folder"),
        ("  ", "--out is empty"),
    ]:
        with pytest.raises(ValueError, match=message):
            fresh_file(out, default)
    assert fresh_file(str(tmp_path / "fig"), default) == str(tmp_path / "fig.png")


def test_viz_refuses_a_users_file_before_any_work(tmp_path, capsys, monkeypatch):
    notes = tmp_path / "notes.pdf"
    notes.write_text("mine", encoding="utf-8")

    def never(*args, **kwargs):
        raise AssertionError("the command ran")

    monkeypatch.setattr("seqlab.viz.gradients.gradient_flow_groups", never)
    assert main(["viz", "gradients", "--out", str(notes)]) == 2
    assert "notes.pdf exists; seqlab does not overwrite files" in capsys.readouterr().err
    assert notes.read_text(encoding="utf-8") == "mine"
    out = tmp_path / "pos.png"
    assert main(["viz", "positions", "--out", str(out), "--positions", "16", "--d-model", "8"]) == 0
    first = out.read_bytes()
    assert main(["viz", "positions", "--out", str(out), "--positions", "16", "--d-model", "8"]) == 2
    assert out.read_bytes() == first
