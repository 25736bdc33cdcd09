import struct

import pytest
import torch

from seqlab.cli import main
from seqlab.layers.positional import sinusoidal_table
from seqlab.viz.positions import plot_positions, rope_scores


def test_rope_score_depends_on_the_offset_only_and_decays():
    s = rope_scores(64, 255)
    assert abs(float(s[0]) - 1.0) < 1e-5  # <q, q> of a unit q
    near, far = s[1:16].abs().mean(), s[128:].abs().mean()
    assert far < near  # the envelope decays with distance
    # relative: the same offsets scored from two absolute positions agree (rope_scores averages n=0 and n=1000)
    from seqlab.layers.positional import RotaryEmbedding

    rope, q = RotaryEmbedding(8), torch.randn(8)[None, None, None]  # (1, 1, 1, k)

    def score(m: int, n: int) -> torch.Tensor:
        return rope(q, positions=torch.tensor([m]))[0, 0, 0] @ rope(q, positions=torch.tensor([n]))[0, 0, 0]

    assert abs(float(score(7, 3) - score(1007, 1003))) < 1e-4


def test_sinusoidal_similarity_is_a_function_of_distance():
    p = sinusoidal_table(64, 32).double()
    sim = p @ p.T
    for k in (1, 5, 20):
        diag = torch.diagonal(sim, offset=k)
        assert torch.allclose(diag, diag[0].expand_as(diag), atol=1e-5)


def test_plot_and_cli(tmp_path, capsys):
    out = plot_positions(tmp_path / "p.png", n_positions=32, d_model=16, grid=6)
    assert out.stat().st_size > 5000
    width, height = struct.unpack(">II", out.read_bytes()[16:24])  # the PNG header's IHDR
    assert width <= 1600 and 0.6 < height / width < 1.2  # a 2 x 2 grid, not a strip
    assert main(["viz", "positions", "--out", str(tmp_path / "cli.png"), "--positions", "16"]) == 0
    assert (tmp_path / "cli.png").is_file() and "wrote" in capsys.readouterr().out
    assert main(["viz", "positions", "--out", str(tmp_path / "bad.png"), "--d-model", "6"]) == 2
    assert "multiple of 4" in capsys.readouterr().err


def test_viz_outputs_default_under_runs():
    from seqlab.cli import make_parser

    parser = make_parser()
    for cmd in (["viz", "positions"], ["viz", "gradients"], ["viz", "attention", "--checkpoint", "x"]):
        assert parser.parse_args(cmd).out.startswith("runs/viz/"), cmd


def test_sizes_past_a_readable_figure_are_refused(tmp_path):
    """--positions 100000 --d-model 4096 asked for 40 GB, --grid 10000 was killed for memory."""
    from seqlab.viz.positions import plot_positions

    for kw in ({"n_positions": 100_000}, {"d_model": 8192}, {"grid": 10_000}):
        with pytest.raises(ValueError, match="draw at most 8192 positions, d_model 4096 and a grid of 64"):
            plot_positions(tmp_path / "p.png", **kw)
