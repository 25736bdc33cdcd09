"""seqlab.kernels.gemm.linear: F.linear's values and gradients with oneDNN's products, and where it steps aside."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from seqlab.kernels import gemm
from seqlab.layers.linear import Linear

pytestmark = pytest.mark.skipif(gemm._op_reason() is not None, reason=f"{gemm._op_reason()}")


@pytest.fixture
def onednn(monkeypatch):
    """oneDNN's products on any CPU (the automatic choice takes them on AMD with AVX-512 only)."""
    monkeypatch.setenv("SEQLAB_GEMM", "onednn")
    monkeypatch.delenv("SEQLAB_DISABLE_KERNELS", raising=False)
    assert gemm.onednn_reason() is None


def _pair(x, w, b):
    """Two leaf copies of (x, w, b), gradients wanted where the originals want them."""

    def leaf(t):
        return None if t is None else t.detach().clone().requires_grad_(t.requires_grad)

    return [leaf(t) for t in (x, w, b)], [leaf(t) for t in (x, w, b)]


def _close(got, ref):
    torch.testing.assert_close(got, ref, rtol=2e-5, atol=2e-5 * ref.abs().max().item())


CASES = {
    "3-d input with bias": lambda: (torch.randn(4, 256, 256), torch.randn(768, 256), torch.randn(768)),
    "no bias": lambda: (torch.randn(1024, 256), torch.randn(256, 256), None),
    "transposed input": lambda: (torch.randn(256, 8, 256).transpose(0, 1), torch.randn(512, 256), None),
    "transposed weight": lambda: (torch.randn(2048, 128), torch.randn(128, 512).t(), torch.randn(512)),
    "rows with a stride": lambda: (torch.randn(512, 2048)[:, :1024], torch.randn(300, 1024)[:256], None),
    "a weight's first columns": lambda: (
        torch.randn(2048, 256),
        torch.randn(1024, 384)[:, :256],
        torch.randn(1024),
    ),
}


def _check_against_f_linear(x, w, b, wants, path):
    """gemm.linear's values and gradients (of x when ``wants`` is 'all') equal F.linear's, through ``path``."""
    x.requires_grad_(wants == "all")
    w.requires_grad_()
    if b is not None:
        b.requires_grad_()
    (x1, w1, b1), (x2, w2, b2) = _pair(x, w, b)
    y = gemm.linear(x1, w1, b1)
    ref = F.linear(x2, w2, b2)
    assert y.grad_fn is not None and type(y.grad_fn).__name__ == path
    assert y.shape == ref.shape
    _close(y, ref)
    g = torch.randn_like(ref)
    y.backward(g)
    ref.backward(g)
    _close(w1.grad, w2.grad)
    assert w1.grad.stride() == w2.grad.stride()  # the layout F.linear's gradient gets
    if b is not None:
        _close(b1.grad, b2.grad)
    assert (x1.grad is None) == (wants != "all")
    if wants == "all":
        _close(x1.grad, x2.grad)
        assert x1.grad.shape == x1.shape


def test_onednn_multiplies_dense_weights_only(onednn, monkeypatch):
    """A weight's column slice (rows a stride apart) reaches oneDNN as a contiguous copy, forward and backward:
    as given, oneDNN took a generic path about 1,000x slower (7.7 s against 7 ms on an AMD EPYC)."""
    seen = []
    real = gemm._onednn

    def recording(x, weight, bias):
        seen.append(weight.is_contiguous() or weight.t().is_contiguous())
        return real(x, weight, bias)

    monkeypatch.setattr(gemm, "_onednn", recording)
    full = torch.randn(
        1024, 384, requires_grad=True
    )  # the slice is taken in the graph, as a decoder takes it
    x, b = torch.randn(2048, 256, requires_grad=True), torch.randn(1024, requires_grad=True)
    y = gemm.linear(x, full[:, :256], b)
    assert type(y.grad_fn).__name__ == "_LinearBackward"
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, full, b), g)
    ref = F.linear(x, full[:, :256], b)
    _close(y, ref)
    for got, want in zip(grads, torch.autograd.grad(ref, (x, full, b), g), strict=True):
        _close(got, want)
    assert seen == [True, True]  # the product and the input gradient


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("wants", ["all", "weights only"])
def test_values_and_gradients_match_f_linear(onednn, case, wants):
    _check_against_f_linear(*CASES[case](), wants, "_LinearBackward")  # oneDNN's path ran


@pytest.mark.parametrize(
    ("rows", "k", "n"), [(512, 256, 256), (4096, 4, 104)]
)  # oneDNN's path, the narrow one
def test_second_derivatives_are_f_linears(onednn, rows, k, n):
    x = torch.randn(rows, k, requires_grad=True)
    w = torch.randn(n, k, requires_grad=True)
    grads = []
    for f in (gemm.linear, F.linear):
        (gx,) = torch.autograd.grad(f(x, w).tanh().sum(), [x], create_graph=True)
        grads.append(torch.autograd.grad(gx.square().sum(), [w])[0])
    _close(*grads)


class _Subclass(torch.Tensor):
    """A tensor subclass (as DTensor is one): its own dispatch may not know oneDNN's operator."""


@pytest.mark.parametrize(
    "why",
    [
        "small",
        "float64",
        "autocast",
        "SEQLAB_GEMM=torch",
        "SEQLAB_DISABLE_KERNELS=gemm",
        "a tensor subclass",
        "no grad (still)",
    ],
)
def test_steps_aside_where_it_should(onednn, monkeypatch, why):
    big = (torch.randn(1024, 256), torch.randn(256, 256))
    x, w = (torch.randn(8, 64), torch.randn(64, 64)) if why == "small" else big
    if why == "float64":
        x, w = x.double(), w.double()
    if why == "a tensor subclass":
        x = x.as_subclass(_Subclass)
    if why.startswith("SEQLAB_"):
        name, value = why.split("=")
        monkeypatch.setenv(name, value)
    w.requires_grad_()
    if why == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = gemm.linear(x, w)
        assert y.dtype == torch.bfloat16  # F.linear under autocast, as nn.Linear runs there
        return
    y = gemm.linear(x, w)
    took_onednn = type(y.grad_fn).__name__ == "_LinearBackward"
    assert took_onednn == (why == "no grad (still)")
    torch.testing.assert_close(y, F.linear(x, w), rtol=2e-5, atol=1e-4)


def test_the_choice_by_machine_and_setting(monkeypatch):
    monkeypatch.delenv("SEQLAB_GEMM", raising=False)
    monkeypatch.delenv("SEQLAB_DISABLE_KERNELS", raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(gemm, "_cpu_vendor", lambda: "AuthenticAMD")
    assert gemm.onednn_reason() is None
    monkeypatch.setattr(gemm, "_cpu_vendor", lambda: "GenuineIntel")
    assert "MKL is the faster library on this CPU" in gemm.onednn_reason()
    monkeypatch.setenv("SEQLAB_GEMM", "onednn")
    assert gemm.onednn_reason() is None
    monkeypatch.setenv("SEQLAB_GEMM", "ONEDNN ")
    assert gemm.onednn_reason() is None
    monkeypatch.setenv("SEQLAB_GEMM", "mkl")
    with pytest.raises(ValueError, match=r"SEQLAB_GEMM must be 'onednn', 'torch' or 'auto', got 'mkl'"):
        gemm.linear(torch.randn(1024, 256), torch.randn(256, 256))
    monkeypatch.setenv("SEQLAB_GEMM", "onednn")
    monkeypatch.setenv("SEQLAB_DISABLE_KERNELS", "all")
    assert "SEQLAB_DISABLE_KERNELS" in gemm.onednn_reason()


def test_linear_is_an_nn_linear_with_its_hooks(onednn):
    torch.manual_seed(0)
    ours, theirs = Linear(256, 128), nn.Linear(256, 128)
    theirs.load_state_dict(ours.state_dict())
    assert isinstance(ours, nn.Linear) and list(ours.state_dict()) == list(theirs.state_dict())
    seen = []
    ours.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    x = torch.randn(2, 1024, 256)
    _close(ours(x), theirs(x))
    assert seen == [torch.Size([2, 1024, 128])]


def test_gpt2_training_step_matches_hugging_face_through_onednn(onednn, monkeypatch):
    """A GPT-2 wide enough that its products go to oneDNN: logits equal HF's, the loss's gradients equal those
    of the same model on torch's products."""
    transformers = pytest.importorskip("transformers")
    from seqlab.interop.hf_gpt2 import convert_gpt2

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=97, n_positions=64, n_embd=256, n_layer=2, n_head=4, attn_implementation="eager"
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    ours = convert_gpt2(hf)
    ids = torch.randint(0, 97, (4, 64))
    with torch.no_grad():
        _close(ours(ids), hf(ids).logits)
    grads = []
    for choice in ("onednn", "torch"):
        monkeypatch.setenv("SEQLAB_GEMM", choice)
        ours.zero_grad(set_to_none=True)
        F.cross_entropy(ours(ids)[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
        grads.append({n: p.grad.clone() for n, p in ours.named_parameters()})
    for name, g in grads[0].items():
        _close(g, grads[1][name])


@pytest.mark.parametrize("setting, said", [("onednn", True), ("torch", False)])
def test_a_cpu_run_says_which_library_multiplies(monkeypatch, caplog, setting, said):
    from seqlab.training import distributed

    monkeypatch.setenv("SEQLAB_GEMM", setting)
    with caplog.at_level("INFO", logger=distributed.log.name):
        distributed.cpu_precision("fp32")
        distributed.cpu_precision(
            "bf16"
        )  # autocast's bf16 products are torch's (oneDNN's bf16 path) either way
    lines = [r.getMessage() for r in caplog.records if "through oneDNN" in r.getMessage()]
    assert len(lines) == said and (not said or "SEQLAB_GEMM=torch keeps them with MKL" in lines[0])


def test_a_bias_of_the_wrong_size_gets_torchs_message_not_onednns(onednn):
    x, w, b = torch.randn(4096, 256), torch.randn(768, 256), torch.randn(5)
    with pytest.raises(RuntimeError) as ours:
        gemm.linear(x, w, b)
    with pytest.raises(RuntimeError) as theirs:
        F.linear(x, w, b)
    assert str(ours.value) == str(theirs.value) and "primitive" not in str(ours.value)


@pytest.mark.parametrize(
    "x, said",
    [
        (torch.randn(4096, 300), r"Linear expects x of shape \(\.\.\., 256\), got \(4096, 300\)"),
        (
            torch.randn(4, 256, dtype=torch.float64),
            "Linear has torch.float32 parameters but x is torch.float64",
        ),
        (
            torch.ones(4, 256, dtype=torch.int64),
            "Linear expects x to be a floating tensor on cpu, got torch.int64",
        ),
        ("x", r"Linear expects x of shape \(\.\.\., 256\), got str"),
        (torch.tensor(1.0), r"Linear expects x of shape \(\.\.\., 256\), got \(\)"),
    ],
)
def test_linear_says_what_it_expects(onednn, x, said):
    with pytest.raises(ValueError, match=said):
        Linear(256, 768)(x)


NARROW_CASES = {
    "k 4, 3-d input with bias": lambda: (torch.randn(8, 1024, 4), torch.randn(104, 4), torch.randn(104)),
    "k 2, no bias": lambda: (torch.randn(4096, 2), torch.randn(256, 2), None),
    "k 15, a view with spaced rows": lambda: (torch.randn(4096, 36)[:, :15], torch.randn(64, 15), None),
    "k 8, transposed weight": lambda: (torch.randn(2048, 8), torch.randn(8, 512).t(), torch.randn(512)),
}


@pytest.mark.parametrize("case", list(NARROW_CASES))
@pytest.mark.parametrize("wants", ["all", "weights only"])
def test_narrow_inputs_match_f_linear(onednn, case, wants):
    _check_against_f_linear(*NARROW_CASES[case](), wants, "_NarrowLinearBackward")


@pytest.mark.parametrize("why", ["k 1", "k 16", "small", "float64", "no grad", "SEQLAB_GEMM=torch"])
def test_narrow_path_steps_aside_where_it_should(onednn, monkeypatch, why):
    k = {"k 1": 1, "k 16": 16}.get(why, 4)
    x, w = torch.randn(16 if why == "small" else 4096, k), torch.randn(104, k, requires_grad=True)
    if why == "float64":
        x, w = x.double(), w.detach().double().requires_grad_()
    if why.startswith("SEQLAB_"):
        monkeypatch.setenv(*why.split("="))
    with torch.set_grad_enabled(why != "no grad"):
        y = gemm.linear(x, w)
    assert y.grad_fn is None or type(y.grad_fn).__name__ not in ("_NarrowLinearBackward", "_LinearBackward")
    torch.testing.assert_close(y, F.linear(x, w))
