"""seqlab.viz.video.plot_clip: a long clip is drawn as every k-th frame, at a bounded width."""

import torch
from PIL import Image

from seqlab.viz.video import MAX_FRAMES_DRAWN, plot_clip


def _width(path) -> int:
    with Image.open(path) as im:
        return im.size[0]


def test_a_long_clip_is_drawn_as_every_kth_frame_at_a_bounded_width(tmp_path):
    torch.manual_seed(0)
    short = torch.randint(0, 255, (MAX_FRAMES_DRAWN, 1, 8, 8), dtype=torch.uint8)
    long = torch.randint(0, 255, (1000, 1, 8, 8), dtype=torch.uint8)
    labels = [str(i % 3) for i in range(1000)]
    words = ["a", "b"]
    attention = torch.softmax(torch.randn(2, 1000), -1)
    w_short = _width(plot_clip(short, tmp_path / "short.png", true_labels=labels[:MAX_FRAMES_DRAWN]))
    w_long = _width(
        plot_clip(
            long,
            tmp_path / "long.png",
            true_labels=labels,
            predicted=labels,
            words=words,
            attention=attention,
        )
    )
    # 1,000 frames: every 21st (48 drawn), no wider than the full clip of 48 frames
    assert w_long <= w_short
    w_few = _width(plot_clip(short[:8], tmp_path / "few.png"))
    assert w_few < w_short  # a short clip stays one column per frame
