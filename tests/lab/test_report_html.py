"""report.html: one self-contained page from a compare folder's own files, checked as text and in Chromium."""

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from seqlab.lab import compare
from seqlab.lab.report_html import main, markdown_to_html, write_report_html
from seqlab.lab.suite import Suite, _adding

QUICK = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "compare-quick"

CHECK = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const out = document.createElement("pre");
  out.id = "seqlab-check";
  out.textContent = JSON.stringify({
    images: images.length,
    loaded: images.filter((i) => i.complete && i.naturalWidth > 0).length,
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
  });
  document.body.appendChild(out);
});
</script>"""
"""Written into a copy of the page: after load, whether every image decoded and whether the page is wider
than the window."""


@pytest.fixture
def quick_folder(tmp_path) -> Path:
    """A copy of the committed compare-quick result folder, without a report of its own."""
    folder = tmp_path / "compare-quick"
    shutil.copytree(QUICK, folder, ignore=shutil.ignore_patterns("report.*", "settings.json"))
    return folder


def _images(page: str) -> list[str]:
    return re.findall(r"<img\b[^>]*\bsrc='([^']*)'", page)


def test_report_is_one_offline_file_with_every_plot_and_mixer(quick_folder):
    path = write_report_html(quick_folder)
    assert path == quick_folder / "report.html"
    page = path.read_text(encoding="utf-8")
    assert not re.search(r"https?://", page), "the page must open offline: no network references"
    assert "<link" not in page and "<script" not in page
    sources = _images(page)
    assert len(sources) == len(list(quick_folder.glob("*.png"))) == 4
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.count("<figcaption>") == 4
    mixers = {row["mixer"] for row in json.loads((quick_folder / "results.json").read_text())}
    headers = re.findall(r"<th class='fam-(\w+)'>([^<]*)</th>", page)
    for m in mixers:
        assert any(text.startswith(f"{m} (") for _, text in headers), m
    assert ("RNN", "lstm (RNN)") in headers and ("SSM", "mamba (SSM)") in headers
    machine = re.search(r"Measured on (.+?), torch", (quick_folder / "table.md").read_text()).group(1)
    assert machine in page and "2.13.0+cpu" in page  # the machine, read from table.md
    assert "no spread can be shown" in page  # the committed records hold no repeats


def test_rendered_in_chromium_every_image_loads_and_nothing_overflows(quick_folder, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("install Debian package chromium")
    page = write_report_html(quick_folder).read_text(encoding="utf-8")
    checked = tmp_path / "checked.html"
    checked.write_text(page.replace("</body>", CHECK + "</body>"), encoding="utf-8")
    args = [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars"]
    args += [
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,900",
        "--virtual-time-budget=5000",
    ]
    done = subprocess.run(
        [*args, "--dump-dom", checked.as_uri()], capture_output=True, text=True, timeout=90, check=True
    )
    found = re.search(r'<pre id="seqlab-check">([^<]*)</pre>', done.stdout)
    assert found, done.stderr[-2000:]
    check = json.loads(found.group(1))
    assert check["images"] == check["loaded"] == 4
    assert check["scrollWidth"] <= check["innerWidth"] == 1280


def test_timings_with_repeats_show_median_iqr_and_range(tmp_path):
    rows = [{"mixer": "gru", "task": "decode", "setting": "context=64", "metric": "latency_ms", "value": 3.0}]
    rows[0]["latency_ms_rounds"] = [1.0, 2.0, 3.0, 4.0, 5.0]
    (tmp_path / "results.json").write_text(json.dumps(rows))
    (tmp_path / "runs").mkdir()
    run = {"decode": [{"context": 512, "latency_ms": 2.0, "latency_ms_rounds": [2.0, 2.0, 4.0]}]}
    (tmp_path / "runs" / "gru__systems.json").write_text(json.dumps(run))
    page = write_report_html(tmp_path).read_text(encoding="utf-8")
    assert (
        "<td>results.json mixer=gru task=decode setting=context=64 latency_ms</td><td>5</td><td>3</td>"
        in page
    )
    assert "<td>2 – 4</td><td>1 – 5</td>" in page  # IQR, then min – max
    assert "gru__systems context=512 latency_ms</td><td>3</td><td>2</td>" in page
    assert "No table.md here" in page and "This folder has no plots" in page


def test_markdown_tables_are_tinted_by_family_by_column_and_by_row():
    text = "# t\n\nsome `code`\n\n| | RNN | SSM |\n|---|---|---:|\n| a | 1<br>2 | 3 |\n\n"
    text += "| model | family | acc |\n|---|---|---|\n| x | Transformer | 0.5 |\n"
    out = markdown_to_html(text)
    assert "<h2>t</h2>" in out and "<code>code</code>" in out
    assert "<th class='fam-RNN'>RNN</th>" in out and "<td class='fam-SSM r'>3</td>" in out
    assert "<td class='fam-RNN'>1<br>2</td>" in out
    assert out.count("class='fam-Transformer'") == 3  # every cell of the row whose family cell says so


TINY = Suite("tiny", 8_000, 1, (_adding(12, 6),), decode_contexts=(8, 32), throughput_lengths=(32,))


def test_compare_writes_the_report_with_its_settings_and_machine(tmp_path, capsys):
    paths = compare(tmp_path, TINY, mixers=["gru", "attention"], progress=False, gradients=False)
    page = paths["report"].read_text(encoding="utf-8")
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["suite"]["budget"] == 8_000 and settings["mixers"] == ["gru", "attention"]
    assert settings["machine"]["torch"] in page and settings["machine"]["CPU"] in page
    assert "<th>mixers</th><td>gru, attention</td>" in page and "seq_len=12" in page
    assert len(_images(page)) == len(paths["plots"]) == 3  # decode, throughput, training curves
    (tmp_path / "report.html").unlink()
    assert main([str(tmp_path)]) == 0 and (tmp_path / "report.html").is_file()  # rebuilt from the files
    assert main([]) == 2
    capsys.readouterr()


def test_a_fenced_block_stays_a_preformatted_block():
    from seqlab.lab.report_html import markdown_to_html

    page = markdown_to_html("## Timing spread\n\n```\nmixer   tokens/s\nrnn     72,975 <3%\n```\n")
    assert "<pre>mixer   tokens/s\nrnn     72,975 &lt;3%</pre>" in page
    assert "```" not in page
