"""`seqlab doctor`: the machine, every package and data set, and per task and suite what is missing."""

import importlib.util

from seqlab import commands_doctor
from seqlab.cli import main


def test_doctor_reports_the_machine_and_every_task(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "torch 2." in out and "CPU:" in out and "CPU bf16 matmul units: " in out
    for what in commands_doctor.NEEDS:
        assert what in out, what


def test_every_need_is_a_known_package_or_data_set():
    known = set(commands_doctor.PACKAGES) | set(commands_doctor.DATA)
    for what, needs in commands_doctor.NEEDS.items():
        for need in needs:
            assert set(need.split("|")) <= known, (what, need)


def test_a_missing_package_is_named_with_its_install_line(capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mnist1d" else real(name, *a)
    )
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "mnist1d        missing: pip install mnist1d requests" in out
    assert "missing task seq_image, source=mnist1d: pip install mnist1d requests" in out
    assert "missing compare --suite quick / full: pip install mnist1d requests" in out
    assert "ready   task shakespeare / text" in out  # the corpus ships inside seqlab
    assert "ready   task video" in out
    assert commands_doctor.missing(("mnist1d|sklearn",)) == []  # either one will do


def test_kernels_are_reported_without_building_them(capsys, monkeypatch, tmp_path):
    import torch

    from seqlab.kernels import build as scan_build

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # an empty cache: nothing built yet
    monkeypatch.setattr(scan_build, "missing_tool", lambda: None)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    labels = [
        "selective scan (Mamba)",
        "GRU / RNN",
        "causal conv (Mamba)",
        "minGRU scan",
        "linear attention",
        "decoding step (GPT)",
        "GELU",
    ]
    for label in [*labels, "LayerNorm", "attention (short seqs)"]:
        assert f"{label:<23} built on first use" in out, label
    assert list(tmp_path.iterdir()) == []  # doctor built nothing
    gpu = "not used: no CUDA GPU" if not torch.cuda.is_available() else "selective scan on GPU"
    assert gpu in out
    from seqlab.kernels.gemm import onednn_reason

    said = "oneDNN for forward products" if onednn_reason() is None else f"MKL (torch's): {onednn_reason()}"
    assert f"{'float32 products':<23} {said}" in out

    monkeypatch.setenv("SEQLAB_DISABLE_KERNELS", "attention")
    assert main(["doctor"]) == 0
    assert (
        f"{'attention (short seqs)':<23} switched off by SEQLAB_DISABLE_KERNELS=attention"
        in capsys.readouterr().out
    )
    monkeypatch.delenv("SEQLAB_DISABLE_KERNELS")

    monkeypatch.setattr(scan_build, "missing_tool", lambda: "no C++ compiler: 'c++' is not on PATH")
    assert main(["doctor"]) == 0
    assert "GRU / RNN               cannot build: no C++ compiler" in capsys.readouterr().out
