"""The caption attention figure: maps over the image keep the attention's mass; bad shapes are refused."""

from __future__ import annotations

import pytest
import torch

from seqlab.viz.captions import attention_over_image, plot_caption_attention


def test_upsampled_maps_keep_each_words_total_weight():
    alpha = torch.softmax(torch.randn(3, 16), -1)  # 3 words over a 4 x 4 grid
    maps = attention_over_image(alpha, 32)
    assert maps.shape == (3, 32, 32)
    torch.testing.assert_close(maps.sum((1, 2)), torch.ones(3), atol=1e-5, rtol=1e-5)
    one_hot = torch.zeros(1, 16)
    one_hot[0, 5] = 1.0  # row 1, column 1 of the grid
    m = attention_over_image(one_hot, 32)[0]
    r, c = divmod(int(m.argmax()), 32)
    assert 8 <= r < 16 and 8 <= c < 16


def test_the_figure_is_written(tmp_path):
    image = torch.randint(0, 255, (3, 32, 32), dtype=torch.uint8)
    alpha = torch.softmax(torch.randn(4, 16), -1)
    path = plot_caption_attention(image, ["a", "red", "circle", "</s>"], alpha, tmp_path / "sub" / "f.png")
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 2000


@pytest.mark.parametrize(
    ("alpha", "match"),
    [(torch.ones(3, 16) / 16, r"\(words, regions\) = \(2, L\)"), (torch.ones(2, 15) / 15, "square grid")],
)
def test_bad_shapes(tmp_path, alpha, match):
    with pytest.raises(ValueError, match=match):
        plot_caption_attention(torch.zeros(3, 32, 32), ["a", "b"], alpha, tmp_path / "f.png")
