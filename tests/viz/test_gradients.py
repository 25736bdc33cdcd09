import torch

from seqlab.cli import main
from seqlab.models import create
from seqlab.tasks.synthetic import AddingTask
from seqlab.viz.gradients import _hidden, gradient_flow, gradient_norms


def test_gradient_norms_match_a_direct_derivative():
    torch.manual_seed(0)
    task = AddingTask(seq_len=12, batch_size=4)
    model = create("test-gru-lm", **task.model_overrides(), n_layers=1)
    norms, _ = gradient_norms(model, task)
    assert len(norms) == 12
    # the last position's gradient is the head's weight times dL/dpred, for every sample
    batch = task.get_batch("val", 0)
    state = model.init_state(4)
    for t in range(12):
        _, state = model.step(batch["x"][:, t], state)
    h = _hidden(state)[-1].detach().requires_grad_(True)  # (b, H): the top layer's h_T
    loss = torch.nn.functional.mse_loss(model.head(h).squeeze(-1), batch["y"].view(-1))
    (g,) = torch.autograd.grad(loss, h)
    assert abs(g.norm(dim=-1).mean().item() - norms[-1]) < 1e-6


def test_tanh_rnn_gradient_vanishes_at_initialization():
    (rnn,) = gradient_flow(cells=("rnn",), seq_len=40, d_model=32)
    assert rnn.norms[0] < 1e-4 * rnn.norms[-1]
    assert all(n > 0 for n in rnn.norms[1:])


def test_cli_writes_the_plot(tmp_path, capsys):
    out = tmp_path / "flow.png"
    assert main(["viz", "gradients", "--out", str(out), "--length", "10", "--d-model", "8"]) == 0
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"
    assert "rnn" in capsys.readouterr().out


def test_zero_gradients_are_marked_as_clamped_not_drawn_as_data(tmp_path, monkeypatch):
    from seqlab.viz import gradients
    from seqlab.viz.gradients import FLOOR, GradientFlow, plot_gradient_flow

    drawn = []
    monkeypatch.setattr(gradients, "save_figure", lambda fig, path: drawn.append(fig))
    init = [GradientFlow("rnn", 0, [0.0, 1e-12, 1e-3], 1.0)]
    trained = [GradientFlow("rnn", 50, [1e-6, 1e-4, 1e-2], 0.1)]
    plot_gradient_flow([init, trained], tmp_path / "flow.png")
    (fig,) = drawn
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["at initialization", "after 50 training steps"]  # both panels when both are given
    for ax in fig.axes:
        texts = [t.get_text() for t in ax.texts]
        assert "zero (clamped for the log scale)" in texts
        assert ax.get_ylim()[0] < FLOOR  # the band sits below the clamped points, inside the panel
