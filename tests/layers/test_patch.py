"""PatchEmbedding: on the CPU the patches-as-rows product equals the convolution (outputs and gradients, float64,
several channel counts and non-square grids); a hook on the projection keeps the convolution; bad sizes name
what would fit."""

import pytest
import torch

from seqlab.layers.patch import PatchEmbedding


def _conv_reference(embed, images):
    return embed.proj(images).flatten(2).transpose(1, 2)  # what torch's convolution gives, (b, n, d)


@pytest.mark.parametrize(("c", "h", "w", "p"), [(1, 28, 28, 4), (3, 16, 24, 8), (2, 6, 9, 3)])
def test_rows_product_equals_the_convolution(c, h, w, p):
    torch.manual_seed(0)
    embed = PatchEmbedding(p, c, 10, dtype=torch.float64)
    x1 = torch.rand(3, c, h, w, dtype=torch.float64, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    ours, ref = embed(x1), _conv_reference(embed, x2)
    assert ours.shape == (3, (h // p) * (w // p), 10)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ours)
    params = list(embed.parameters())
    for a, b in zip(
        torch.autograd.grad(ours, [x1, *params], g), torch.autograd.grad(ref, [x2, *params], g), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_a_hook_on_the_projection_runs_the_convolution():
    embed, seen = PatchEmbedding(4, 3, 8), []
    embed.proj.register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    images = torch.rand(2, 3, 16, 8)
    torch.testing.assert_close(embed(images), _conv_reference(embed, images))
    assert seen[0] == (2, 8, 4, 2)


def test_sizes_the_patch_does_not_divide_are_refused_with_what_fits():
    with pytest.raises(ValueError, match=r"image size 30×28 is not a multiple of the patch size 4.*28 or 32"):
        PatchEmbedding(4, 1, 8)(torch.rand(1, 1, 30, 28))


def test_images_of_another_dtype_than_the_weights_are_refused_by_name():
    with pytest.raises(
        ValueError, match=r"PatchEmbedding has torch.float32 parameters but images is torch.float64"
    ):
        PatchEmbedding(4, 3, 8)(torch.rand(2, 3, 16, 16, dtype=torch.float64))
