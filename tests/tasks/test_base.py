"""The helpers every task shares: one check per kind of argument, describe() from the constructor, the
stratified split order."""

from typing import Literal

import pytest
import torch

from seqlab.tasks.base import Task, channel_stats, check_choice, check_int, stratified_order
from seqlab.tasks.synthetic import AddingTask, CopyTask


def test_check_choice_reads_the_literal_type():
    assert check_choice("sampling", "random", Literal["stream", "random"]) == "random"
    assert check_choice("mode", None, Literal["rows", "pixels"] | None) is None
    with pytest.raises(ValueError, match=r"mode must be one of \('rows', 'pixels', None\), got 'cols'"):
        check_choice("mode", "cols", Literal["rows", "pixels"] | None)
    with pytest.raises(ValueError, match="seq_len must be an integer >= 2, got True"):
        check_int("seq_len", True, 2)


def test_describe_reports_the_constructor_arguments_and_the_derived_numbers():
    assert AddingTask(seq_len=7, batch_size=3, seed=1).describe() == {
        "name": "adding",
        "seq_len": 7,
        "batch_size": 3,
        "seed": 1,
        "baseline_mse": 1 / 6,
    }
    info = CopyTask(n_symbols=4).describe()
    assert info["vocab_size"] == 6 and info["n_symbols"] == 4 and "copy_len" in info
    assert Task().describe() == {"name": "task"}


def test_text_sampling_is_checked(tmp_path):
    from seqlab.tasks.text import CharLMTask

    path = tmp_path / "t.txt"
    path.write_text("abcdefgh" * 200, encoding="utf-8")
    with pytest.raises(ValueError, match=r"sampling must be one of \('stream', 'random'\), got 'shuffle'"):
        CharLMTask(source=str(path), sampling="shuffle")


@pytest.mark.parametrize(
    ("seed", "sizes"), [(0, [60, 25, 9, 4, 2, 1]), (1, [60, 25, 9, 4, 2, 1]), (2, [500] + [3] * 11)]
)
def test_stratified_order_leads_with_one_of_each_class_then_spreads_each_evenly(seed, sizes):
    sizes = torch.tensor(sizes)
    n, k = int(sizes.sum()), len(sizes)
    labels = torch.repeat_interleave(torch.arange(k), sizes)
    labels = labels[torch.randperm(n, generator=torch.Generator().manual_seed(100 + seed))]
    order = stratified_order(labels, seed)
    assert sorted(order.tolist()) == list(range(n))
    assert sorted(labels[order[:k]].tolist()) == list(range(k))  # one of every class first
    rest = sizes - 1  # after the first k: each class in its share of every stretch, to within one example
    for m in range(k, n, max(1, n // 150)):
        for piece in (order[k:m], order[m:]):
            counts = torch.bincount(labels[piece], minlength=k).double()
            share = rest.double() * len(piece) / (n - k)
            assert torch.all((counts - share).abs() < 1.0), (m, counts.tolist(), share.tolist())
    assert torch.equal(order, stratified_order(labels, seed))  # a function of the labels and the seed


@pytest.mark.parametrize("channel_dim", [1, 2])
def test_channel_stats_match_torch_float64_statistics_chunk_by_chunk(channel_dim):
    g = torch.Generator().manual_seed(channel_dim)
    shape = (
        (37, 3, 5, 6) if channel_dim == 1 else (11, 4, 2, 5, 5)
    )  # images (N, c, S, S), clips (N, t, c, S, S)
    for images in (
        torch.randint(0, 256, shape, dtype=torch.uint8, generator=g),
        torch.full(shape, 255, dtype=torch.uint8),
    ):
        dims = tuple(d for d in range(images.dim()) if d != channel_dim)
        pixels = images.double() / 255
        mean, std = channel_stats(images, channel_dim, chunk=4)  # 4 examples at a time: 10 or 3 chunks
        torch.testing.assert_close(mean, pixels.mean(dims).float(), rtol=0, atol=0)
        torch.testing.assert_close(std, pixels.std(dims).float(), rtol=0, atol=1e-12)
        assert mean.dtype == std.dtype == torch.float32 and mean.shape == (images.size(channel_dim),)
    _, std = channel_stats(torch.full((1, 2, 1, 1), 7, dtype=torch.uint8), 1)
    assert std.tolist() == [0.0, 0.0]  # one value per channel: no spread (not nan)


def test_torch_threads_sets_the_count_within_and_restores_it_after_an_error():
    from seqlab.tasks.base import torch_threads

    before = torch.get_num_threads()
    try:
        with torch_threads(1):
            assert torch.get_num_threads() == 1
            raise KeyError("x")
    except KeyError:
        pass
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before  # None: left as it was


def test_the_shared_helpers_refuse_what_they_cannot_use():
    import numpy as np

    from seqlab.tasks.base import spread, torch_threads

    images = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    for bad, dim in ((images.float(), 1), (images, 0), (images, 4), (images.numpy(), 1)):
        with pytest.raises(ValueError, match="channel_stats takes uint8 images"):
            channel_stats(bad, dim)
    for n in (0, -1, 2.5):
        with pytest.raises(ValueError, match="threads must be an integer >= 1"), torch_threads(n):
            pass
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        spread(np.arange(5), 0)
