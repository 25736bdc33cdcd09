"""The video model: shapes of the three heads, online step_frame equals the forward for every mixer, causality,
the caption decoder's step loop equals teacher forcing, gradients everywhere, bad inputs."""

import pytest
import torch

from seqlab.layers import list_mixers
from seqlab.models import create
from seqlab.models.video import VideoConfig, VideoModel

PRESETS = ["test-video", "test-video-cnn", "test-video-frames", "test-video-caption", "test-vivit"]


def _clips(b=2, t=6, size=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, 1, size, size, generator=g, dtype=dtype)


@pytest.mark.parametrize("name", PRESETS)
def test_heads_shapes_and_every_parameter_gets_a_gradient(name):
    model = create(name)
    c, x = model.config, _clips()
    if c.head == "caption":
        tgt = torch.randint(3, c.vocab_size, (2, 5))
        out = model(x, tgt)
        assert out.shape == (2, 5, c.vocab_size)
    else:
        out = model(x)
        assert out.shape == ((2, c.n_classes) if c.head == "action" else (2, 6, c.n_classes))
    out.float().pow(2).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing


@pytest.mark.parametrize("mixer", list_mixers())
@pytest.mark.parametrize("head", ["frames", "action"])
def test_step_frame_equals_the_full_forward(mixer, head):
    torch.manual_seed(0)
    model = create("test-video-frames", head=head, mixer=mixer).double().eval()
    x = _clips(t=7, dtype=torch.float64)
    full = model(x)  # (b, t, K) or (b, K)
    state, outs = model.init_state(2, dtype=torch.float64), []
    for i in range(x.size(1)):
        y, state = model.step_frame(x[:, i], state)
        outs.append(y)
    online = torch.stack(outs, 1)
    if head == "frames":
        torch.testing.assert_close(online, full, rtol=0, atol=1e-10)
    else:  # the action after the last frame; and after frame i, the action of the clip so far
        torch.testing.assert_close(online[:, -1], full, rtol=0, atol=1e-10)
        torch.testing.assert_close(online[:, 2], model(x[:, :3]), rtol=0, atol=1e-10)


@pytest.mark.parametrize("mixer", ["lstm", "attention", "mamba"])
def test_frame_labels_never_depend_on_later_frames(mixer):
    model = create("test-video-frames", mixer=mixer).double().eval()
    x = _clips(t=8, dtype=torch.float64)
    y = x.clone()
    y[:, 5:] = torch.randn_like(y[:, 5:])
    a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=1e-12)
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-6


def test_the_temporal_transformer_sees_the_whole_clip():
    model = create("test-vivit", head="frames", n_classes=5).double().eval()
    x = _clips(t=6, dtype=torch.float64)
    y = x.clone()
    y[:, 5] = torch.randn_like(y[:, 5])
    assert (model(x)[:, 0] - model(y)[:, 0]).abs().max() > 1e-6  # bidirectional: frame 0 changes


@pytest.mark.parametrize("decoder", ["lstm", "transformer"])
def test_caption_step_loop_equals_teacher_forcing(decoder):
    model = create("test-video-caption", decoder=decoder, n_heads=2).double().eval()
    x, tgt = _clips(dtype=torch.float64), torch.randint(3, 24, (2, 6))
    full, alpha = model(x, tgt, return_attention=True)
    state, logits = model.start(x), []
    for i in range(tgt.size(1)):
        out, state, _ = model.step(tgt[:, i], state)
        logits.append(out)
    torch.testing.assert_close(torch.stack(logits, 1), full, rtol=0, atol=1e-10)
    assert alpha.shape == (2, 6, 6)  # (b, words, frames)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(2, 6, dtype=torch.float64))


def test_generate_beam_is_batched_and_returns_attention_over_frames():
    torch.manual_seed(0)
    model = create("test-video-caption").eval()
    x = _clips(b=3)
    ids, alpha = model.generate(x, max_new_tokens=6, beam_size=3, return_attention=True)
    assert ids.shape[0] == 3 and alpha.shape[0] == 3 and alpha.shape[2] == 6
    for i in range(3):
        alone = model.generate(x[i : i + 1], max_new_tokens=6, beam_size=3)
        torch.testing.assert_close(alone[0, : alone.size(1)], ids[i, : alone.size(1)])


def test_bottleneck_decoder_reads_exactly_n_frames():
    model = create("test-video-caption", attention="none", n_frames=6)
    assert model(_clips(t=6), torch.ones(2, 3, dtype=torch.long)).shape == (2, 3, 24)
    with pytest.raises(ValueError, match="exactly n_frames=6"):
        model(_clips(t=5), torch.ones(2, 3, dtype=torch.long))


def test_bad_inputs_get_clear_errors():
    model = create("test-video")
    with pytest.raises(ValueError, match=r"expected clips \(b, t, 1, 16, 16\)"):
        model(torch.randn(2, 6, 3, 16, 16))
    with pytest.raises(ValueError, match="must be floats"):
        model(torch.zeros(2, 6, 1, 16, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="at least one frame"):
        model(torch.randn(2, 0, 1, 16, 16))
    with pytest.raises(ValueError, match="takes clips only"):
        model(_clips(), torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="generate needs head='caption'"):
        model.generate(_clips())
    with pytest.raises(ValueError, match="needs the caption so far"):
        create("test-video-caption")(_clips())
    vivit = create("test-vivit", n_frames=6)
    with pytest.raises(ValueError, match="longer than the model's n_frames=6"):
        vivit(_clips(t=7))
    with pytest.raises(ValueError, match="causal temporal model"):
        vivit.init_state(2)
    with pytest.raises(ValueError, match="pool='last'"):
        create("test-video", pool="mean").init_state(2)


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="divisible by 2"):
        VideoConfig(frame_encoder="cnn", frame_size=20, channels=[8, 8, 8])
    with pytest.raises(ValueError, match="multiple of patch_size"):
        VideoConfig(frame_size=30, patch_size=4)
    with pytest.raises(ValueError, match="unknown mixer"):
        VideoConfig(mixer="transformerxl")
    with pytest.raises(ValueError, match="cross-attention"):
        VideoConfig(head="caption", decoder="transformer", attention="none")
    with pytest.raises(ValueError):
        VideoConfig(head="nonsense")


def test_presets_round_trip_through_their_config():
    import dataclasses

    from seqlab.models import build

    model = create("test-video-caption")
    again = build("video", dataclasses.asdict(model.config))
    assert isinstance(again, VideoModel)
    assert again.config == model.config
    again.load_state_dict(model.state_dict())


def test_an_empty_batch_or_clip_is_named():
    model = VideoModel(VideoConfig(n_classes=5, frame_size=16, d_model=16))
    for shape in ((0, 6, 1, 16, 16), (2, 0, 1, 16, 16)):
        with pytest.raises(ValueError, match=r"expected at least one clip of at least one frame"):
            model(torch.rand(*shape))
