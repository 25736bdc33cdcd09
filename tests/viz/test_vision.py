"""Attention over images: rollout against a case worked by hand, patch-grid maps, and the ViT attention figure."""

import pytest
import torch

from seqlab.models import create
from seqlab.viz.vision import attention_rollout, patch_grid_map, plot_vit_attention

pytest.importorskip("matplotlib")

# Two layers, one image, two heads, two tokens.
#   layer 1: heads [[1, 0], [0, 1]] and [[0, 1], [1, 0]] -> mean [[.5, .5], [.5, .5]]
#            A_1 = 0.5 mean + 0.5 I = [[.75, .25], [.25, .75]]
#   layer 2: both heads [[1, 0], [1, 0]] -> mean [[1, 0], [1, 0]];  A_2 = [[1, 0], [.5, .5]]
#   R = A_2 A_1 = [[.75, .25], [.5 * .75 + .5 * .25, .5 * .25 + .5 * .75]] = [[.75, .25], [.5, .5]]
#   without the residual: W_2 W_1 = [[1, 0], [1, 0]] [[.5, .5], [.5, .5]] = [[.5, .5], [.5, .5]]
#   max fusion: layer 1 [[1, 1], [1, 1]] -> 0.5 max + 0.5 I = [[1, .5], [.5, 1]], rows renormalized
#               [[2/3, 1/3], [1/3, 2/3]]; layer 2 as the mean: R = [[2/3, 1/3], [.5, .5]]
HAND = torch.tensor(
    [
        [[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]],
        [[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]]],
    ]
)[:, None]  # (L, b, h, T, T) = (2, 1, 2, 2, 2)


def test_rollout_of_a_case_worked_by_hand():
    torch.testing.assert_close(attention_rollout(HAND), torch.tensor([[[0.75, 0.25], [0.5, 0.5]]]))
    torch.testing.assert_close(attention_rollout(HAND, residual=False), torch.full((1, 2, 2), 0.5))
    third = 1.0 / 3.0
    expected_max = torch.tensor([[[2 * third, third], [0.5, 0.5]]])
    torch.testing.assert_close(attention_rollout(HAND, head_fusion="max"), expected_max)
    # min fusion: layer 1 all zeros -> 0.5 I renormalized = I; layer 2 [[1, 0], [1, 0]] -> A_2 as above
    torch.testing.assert_close(
        attention_rollout(HAND, head_fusion="min"), torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])
    )


def test_rollout_of_one_layer_is_half_attention_half_identity():
    maps = torch.rand(1, 2, 3, 5, 5, generator=torch.Generator().manual_seed(0)).softmax(-1)
    expected = 0.5 * maps[0].mean(1) + 0.5 * torch.eye(5)
    torch.testing.assert_close(attention_rollout(maps), expected)


def test_rollout_rows_sum_to_one_and_order_matters():
    g = torch.Generator().manual_seed(1)
    maps = (3 * torch.randn(4, 2, 3, 7, 7, generator=g)).softmax(-1)  # (L, b, h, T, T)
    r = attention_rollout(maps)
    assert r.shape == (2, 7, 7) and (r >= 0).all()
    torch.testing.assert_close(r.sum(-1), torch.ones(2, 7))
    assert not torch.allclose(r, attention_rollout(maps.flip(0)))  # the product runs first layer to last


@pytest.mark.parametrize(
    ("maps", "kwargs", "message"),
    [
        (torch.rand(2, 3, 4, 4), {}, r"5-D"),
        (torch.rand(2, 1, 3, 4, 5), {}, r"square token axes"),
        (torch.rand(2, 1, 3, 4, 4), {"head_fusion": "median"}, r"head_fusion must be one of"),
    ],
)
def test_rollout_refuses_bad_inputs(maps, kwargs, message):
    with pytest.raises(ValueError, match=message):
        attention_rollout(maps, **kwargs)


def test_patch_grid_map_drops_the_class_token_and_keeps_row_major_order():
    row = torch.arange(7.0)  # class token, then patches 0 ... 5 of a 2×3 grid
    torch.testing.assert_close(
        patch_grid_map(row, (2, 3), has_cls=True), torch.tensor([[1.0, 2, 3], [4, 5, 6]])
    )
    torch.testing.assert_close(
        patch_grid_map(row[1:], (3, 2), has_cls=False), torch.tensor([[1.0, 2], [3, 4], [5, 6]])
    )
    with pytest.raises(ValueError, match=r"does not fit a 2×3 grid with a class token: expected \(7,\)"):
        patch_grid_map(row[1:], (2, 3), has_cls=True)


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # IHDR width, height


@pytest.fixture(scope="module")
def vit_maps():
    torch.manual_seed(0)
    model = create(
        "test-vit"
    ).eval()  # 16×16 images, patch 4: a 4×4 grid and a class token; 2 layers, 2 heads
    image = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return image[0], model.attention_maps(image)  # (3, 16, 16), (2, 1, 2, 17, 17)


def test_plot_writes_a_png_with_one_panel_per_head(vit_maps, tmp_path):
    image, maps = vit_maps
    path = plot_vit_attention(image, maps, (4, 4), tmp_path / "deep" / "cls.png")
    assert path == tmp_path / "deep" / "cls.png" and path.is_file()
    width, height = _png_size(path)
    assert width > 2 * height  # image, 2 heads and the rollout side by side
    assert 5_000 < path.stat().st_size < 2_000_000


def test_plot_of_a_patch_query_on_a_grey_uint8_image_with_bilinear_overlay(vit_maps, tmp_path):
    _, maps = vit_maps
    grey = torch.randint(0, 256, (1, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    path = plot_vit_attention(
        grey, maps[:, 0], (4, 4), tmp_path / "p5.png", layer=0, query=5, upsample="bilinear"
    )
    assert _png_size(path)[0] > 0 and path.stat().st_size > 5_000


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"grid": (3, 3)}, r"maps have T=17 tokens but a 3×3 grid with a class token has 10"),
        ({"has_cls": False}, r"maps have T=17 tokens but a 4×4 grid without a class token has 16"),
        ({"layer": 2}, r"layer 2 out of range for 2 layers"),
        ({"query": 16}, r"query must be 'cls' or a patch index in \[0, 16\), got 16"),
        ({"query": "mean"}, r"query must be 'cls' or a patch index"),
        ({"upsample": "bicubic"}, r"upsample must be 'nearest' or 'bilinear'"),
        ({"image": torch.rand(2, 16, 16)}, r"1 or 3 channels"),
        ({"image": torch.rand(3, 18, 16)}, r"18×16 is not a 4×4 grid of whole patches"),
        ({"maps": torch.rand(2, 2, 2, 17, 17)}, r"maps hold 2 images"),
    ],
)
def test_plot_refuses_inputs_that_do_not_match(vit_maps, tmp_path, change, message):
    image, maps = vit_maps
    args = {"image": image, "maps": maps, "grid": (4, 4), "path": tmp_path / "x.png"} | change
    with pytest.raises(ValueError, match=message):
        plot_vit_attention(**args)
    assert not (tmp_path / "x.png").exists()


def test_cls_query_without_a_class_token_is_refused(tmp_path):
    maps = torch.rand(2, 1, 2, 16, 16).softmax(-1)  # mean pooling: patches only
    with pytest.raises(ValueError, match="query='cls' needs a class token"):
        plot_vit_attention(torch.rand(3, 16, 16), maps, (4, 4), tmp_path / "x.png", has_cls=False)
    path = plot_vit_attention(torch.rand(3, 16, 16), maps, (4, 4), tmp_path / "x.png", has_cls=False, query=0)
    assert path.is_file()
