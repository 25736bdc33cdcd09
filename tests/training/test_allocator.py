"""keep_freed_memory: a training process stops page-faulting fresh memory in every step."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import resource, sys, torch
    torch.set_num_threads(1)
    if sys.argv[1] == "keep":
        from seqlab.training.allocator import keep_freed_memory
        assert keep_freed_memory() and keep_freed_memory()  # applied, and idempotent
    from seqlab.layers.scan import selective_scan
    b, t, d, n = 32, 72, 120, 16  # the lab's Mamba scan, chunked PyTorch path: buffers (b, 32, n, d) of 8 MB
    u, dl = torch.randn(b, t, d, requires_grad=True), torch.randn(b, t, d, requires_grad=True)
    A = (-torch.rand(d, n) - 0.5).requires_grad_()
    B, C = torch.randn(b, t, n, requires_grad=True), torch.randn(b, t, n, requires_grad=True)
    def step():
        selective_scan(u, dl, A, B, C, delta_softplus=True, chunk_size=32, impl="chunked").sum().backward()
    step(); step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        step()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3)
    """
)


def faults_per_step(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_training_steps_reuse_memory_instead_of_faulting_it_in():
    default = faults_per_step("default")
    # a kept run faults in one of two modes (920 or 1,447 times per step on one Intel Xeon; 0-230 or 2,220-2,340
    # on an AMD EPYC): the fewest of up to four runs is the allocator's steady state (two runs both landed in the
    # higher mode once on the AMD EPYC)
    kept = faults_per_step("keep")
    for _ in range(3):
        if kept < 2048:
            break
        kept = min(kept, faults_per_step("keep"))
    assert kept < 2048, kept  # fewer than one 8 MB buffer's pages (4 kB each) per step
    # glibc's defaults fault 9-63 MB in per step here (2,300-16,100 faults over repeated runs, machines and
    # torch versions), so the bound is 2.5x
    assert default > 2.5 * kept, (default, kept)
