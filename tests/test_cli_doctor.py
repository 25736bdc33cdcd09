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
        "GRU / RNN / LSTM",
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
    assert "GRU / RNN / LSTM        cannot build: no C++ compiler" in capsys.readouterr().out


def test_prune_kernels_removes_only_this_environments_superseded_builds(tmp_path, capsys, monkeypatch):
    """A build of one of seqlab's kernels for this Python, torch and CPU from other sources goes; the current
    builds, builds for another torch, folders seqlab did not name and a link stay."""
    from seqlab.kernels import prune

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    root = tmp_path / "seqlab"
    current = prune.current_names()
    scan = current[0]  # seqlab_scan_<isa>_<python and torch>_<digest>
    old = root / (scan[:-10] + "0123456789")
    other_torch = root / scan.replace("torch", "torch9_9_9_")
    kept = [root / name for name in current] + [other_torch, root / "seqlab_scan_notes", root / "mine"]
    for folder in [old, *kept]:
        folder.mkdir(parents=True)
        (folder / "lib.so").write_bytes(b"x" * 1000)
    (root / (scan[:-10] + "abcdefabcd")).symlink_to(tmp_path / "mine-elsewhere", target_is_directory=True)
    assert main(["doctor"]) == 0
    assert (
        "1 superseded by this seqlab's sources (0.0 MB): seqlab doctor --prune-kernels"
        in capsys.readouterr().out
    )
    assert main(["doctor", "--prune-kernels"]) == 0
    out = capsys.readouterr().out
    assert f"removed {old} (0.0 MB)" in out and "1 superseded kernel builds removed" in out
    assert not old.exists() and all(folder.is_dir() for folder in kept)
    assert (root / (scan[:-10] + "abcdefabcd")).is_symlink()
    assert main(["doctor", "--prune-kernels"]) == 0  # nothing left to remove
    assert "0 superseded kernel builds removed" in capsys.readouterr().out
