"""report.html: one self-contained page for a result folder of ``seqlab compare``.

Built only from the folder's own files, so it can be rebuilt for any finished folder
(``python -m seqlab.lab.report_html RESULT_DIR``): ``table.md`` (rendered, its columns and rows tinted by
model family with the plots' palette, ``seqlab.viz.figures.FAMILY_COLOURS``), every ``*.png`` (embedded as a
base64 data URI with a caption saying what it shows), ``results.json`` and the run cache ``runs/*.json``
(the spread of every timing stored with its repeats), and ``settings.json``, which ``seqlab compare`` writes
beside the report: the suite's settings and the machine (CPU, threads, torch). A folder without
``settings.json`` shows what its table says about the machine and the settings its run files stored.
The page needs no network: no external CSS, scripts, fonts or images.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from seqlab.viz.figures import FAMILY_COLOURS, mixer_family, shade

__all__ = ["CAPTIONS", "write_report_html"]

CAPTIONS = {
    "decode.png": "Decoding cost against the context already read (log–log). Left: ms per generated token; flat "
    "is O(1) per token (recurrent and state-space mixers), rising is attention reading a longer KV cache. "
    "Right: bytes of the state carried between tokens, constant for a fixed-size state, linear in the "
    "context for a KV cache.",
    "throughput.png": "Training speed: tokens/s of forward + backward + optimizer step (batch 8) per mixer, "
    "coloured by family; longer is faster.",
    "accuracy_vs_length.png": "Each task's headline metric against the sequence length, for the tasks run at "
    "several lengths: how each mixer's memory holds up as the distance to remember grows.",
    "training_curves.png": "Training loss against step for every mixer on every task setting (log scale). "
    "Dashed: the chance level, the loss of a guess that ignores the input (uniform over the answers, or the "
    "mean for a regression); a curve that stays on it learned nothing.",
    "gradient_flow.png": "The vanishing gradient: ‖∂L/∂h_t‖, how much of the gradient of the loss at the last "
    "position reaches the hidden state at position t (log scale), RNN, LSTM and GRU on the adding problem. "
    "A line falling toward early positions: early inputs barely train. Hatched: gradients exactly zero.",
    "bleu-by-length.png": "Test BLEU by source-sentence length: with and without attention.",
    "exact-seen-heldout.png": "Captions read back exactly, on seen and on held-out colour–shape pairs.",
    "video-suite.png": "Every mixer on the video tasks: the headline metric per task, by family.",
    "alignment-": "Attention alignment of one translated sentence: bright cells are the source words read "
    "while writing each target word.",
    "attention-": "Where the captioner looks while writing each word of its caption.",
    "caption-heldout": "A held-out scene with the caption each model wrote for it.",
    "caption-clip": "One test clip: its frames, the true and the predicted caption, and the frames each word "
    "attends to.",
    "frames-": "Per-frame predictions on one clip against the truth.",
}
"""What each plot of a compare folder shows, by file name, or by the start of the name for keys without '.png'."""

REPEAT_SUFFIXES = ("_rounds", "_samples", "_repeats", "_times")
"""A list of at least two numbers under a key with one of these endings is the repeats of one timing."""

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;margin:0 auto;max-width:1180px;
padding:12px 20px;line-height:1.45}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #d4d4d4;padding:3px 7px;vertical-align:top}
th{background:#f3f3f3}td.r{text-align:right}
figure{margin:18px 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:14px;color:#444;max-width:900px}
.swatch{display:inline-block;padding:1px 10px;margin-right:6px;border-radius:3px;color:#fff}
code{background:#f5f5f5;padding:0 3px}
"""


def _family_css() -> str:
    rules = [
        f"th.fam-{f}{{background:{c};color:#fff}}td.fam-{f}{{background:{shade(c, 0.86)}}}"
        f".swatch.fam-{f}{{background:{c}}}"
        for f, c in FAMILY_COLOURS.items()
    ]
    return "\n".join(rules)


# ---- reading the folder ------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_runs(folder: Path, keys: set[str] | None = None) -> dict[str, Any]:
    """``runs/*.json``, the compare's run cache, by file stem (only ``keys`` where given: the runs of the
    compare that wrote the page, not those of earlier ones in the folder); empty where the folder has none."""
    runs = {
        f.stem: _read_json(f)
        for f in sorted((folder / "runs").glob("*.json"))
        if keys is None or f.stem in keys
    }
    return {stem: data for stem, data in runs.items() if isinstance(data, dict)}


def _family_of(text: str) -> str | None:
    """The family a table header or first cell names: 'RNN', 'gru (RNN)', 'lstm' or a row's 'SSM' cell."""
    text = re.sub(r"<[^>]+>", "", text).strip()
    if text in FAMILY_COLOURS and text != "other":
        return text
    found = re.search(r"\((RNN|Transformer|SSM)\)\s*$", text)
    if found:
        return found.group(1)
    family = mixer_family(text) if re.fullmatch(r"[a-z0-9][a-z0-9-]*", text) else "other"
    return None if family == "other" else family


# ---- Markdown (the subset table.md uses) to HTML -----------------------------------------------------------


def _inline(text: str) -> str:
    """Escape ``text`` and keep the inline Markdown table.md uses: `code`, **bold** and <br>."""
    out = html.escape(text, quote=False).replace("&lt;br&gt;", "<br>")
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table(lines: list[str]) -> str:
    """A Markdown pipe table as HTML, tinted by family: by column where headers name families or mixers, by
    row where a 'family' column or the first cell names one."""
    head, rule, body = _cells(lines[0]), _cells(lines[1]), [_cells(x) for x in lines[2:]]
    col_family = [_family_of(h) for h in head]
    family_col = next((i for i, h in enumerate(head) if h.lower() == "family"), None)
    right = [c.endswith(":") for c in rule]
    out = ["<div class='scroll'><table><thead><tr>"]
    out += [f"<th{_cls(col_family[i])}>{_inline(h)}</th>" for i, h in enumerate(head)]
    out.append("</tr></thead><tbody>")
    for row in body:
        row_family = _family_of(row[family_col] if family_col is not None else row[0]) if row else None
        out.append("<tr>")
        for i, cell in enumerate(row):
            family = col_family[i] if i < len(col_family) and col_family[i] else row_family
            align = " r" if i < len(right) and right[i] else ""
            out.append(f"<td{_cls(family, align)}>{_inline(cell)}</td>")
        out.append("</tr>")
    return "".join(out) + "</tbody></table></div>"


def _cls(family: str | None, extra: str = "") -> str:
    names = (f"fam-{family}" if family else "") + extra
    return f" class='{names.strip()}'" if names.strip() else ""


def markdown_to_html(text: str) -> str:
    """Headings, paragraphs and pipe tables, blocks apart by blank lines: the Markdown of a compare's table.md."""
    out = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = block.splitlines()
        if heading := re.match(r"^(#{1,4})\s+(.*)", lines[0]):
            level = len(heading.group(1)) + 1  # the page's own title is the only h1
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            lines = lines[1:]
        if lines and lines[0].startswith("```"):  # a fenced block (the speed summary), kept as written
            out.append(f"<pre>{html.escape(chr(10).join(ln for ln in lines[1:] if ln != '```'))}</pre>")
        elif len(lines) > 1 and all(line.startswith("|") for line in lines):
            out.append(_table(lines))
        elif lines:
            out.append(f"<p>{_inline(' '.join(lines))}</p>")
    return "\n".join(out)


def _caption(name: str) -> str:
    starts = [c for key, c in CAPTIONS.items() if not key.endswith(".png") and name.startswith(key)]
    return CAPTIONS.get(name) or (starts[0] if starts else name.removesuffix(".png").replace("-", " "))


def _figures(folder: Path, plots: list[Path] | None = None) -> str:
    """The compare's plots (``plots``; without them every PNG of the folder, not the report's own screenshot),
    embedded, with their captions."""
    out = []
    for png in sorted(folder.glob("*.png")) if plots is None else sorted(Path(p) for p in plots):
        if png.name == "report.png":
            continue
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        caption = _inline(_caption(png.name))
        out.append(
            f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(png.name)}'>"
            f"<figcaption><strong>{html.escape(png.name)}</strong>: {caption}</figcaption></figure>"
        )
    return "\n".join(out) or "<p>This folder has no plots.</p>"


def _repeats(obj: Any, label: str = "") -> list[tuple[str, list[float]]]:
    """(what, values) for every list of repeats (:data:`REPEAT_SUFFIXES`) anywhere in ``obj``."""
    found = []
    if isinstance(obj, dict):
        tags = [f"{k}={obj[k]}" for k in ("mixer", "task", "setting", "context", "length") if k in obj]
        here = " ".join([label, *tags]).strip()
        for key, value in obj.items():
            numbers = isinstance(value, list) and all(isinstance(v, int | float) for v in value)
            if key.endswith(REPEAT_SUFFIXES) and numbers and len(value) >= 2:
                found.append((f"{here} {key.rsplit('_', 1)[0]}".strip(), [float(v) for v in value]))
            elif isinstance(value, dict | list) and key != "settings":
                found += _repeats(value, here)
    elif isinstance(obj, list):
        for value in obj:
            found += _repeats(value, label)
    return found


def _spread_row(what: str, values: list[float]) -> str:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    cells = [
        what,
        str(len(values)),
        f"{median:.4g}",
        f"{q1:.4g} – {q3:.4g}",
        f"{min(values):.4g} – {max(values):.4g}",
    ]
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


def _timings(rows: list[dict[str, Any]], runs: dict[str, Any]) -> str:
    """The spread of every timing the records hold with its repeats; a plain statement where they hold none."""
    found = _repeats(rows, "results.json") + [r for stem, data in runs.items() for r in _repeats(data, stem)]
    if found:
        head = "<tr><th>timing</th><th>repeats</th><th>median</th><th>IQR</th><th>min – max</th></tr>"
        body = "".join(_spread_row(what, values) for what, values in found)
        return f"<div class='scroll'><table>{head}{body}</table></div>"
    metrics = {r.get("metric") for r in rows if isinstance(r, dict)}
    what = " and ".join(name for metric, name in _TIMED.items() if metric in metrics)
    what = (
        f"{what} as one number each (a median taken during the run)" if what else "every timing as one number"
    )
    return (
        f"<p>The records of this folder hold {what}, not the repeats behind it: no spread can be shown.</p>"
    )


_TIMED = {"latency_ms": "decode latency", "train_tokens_per_s": "training throughput"}


def _stored_suite(runs: dict[str, Any], table: str) -> tuple[dict[str, Any] | None, str]:
    """The settings the run files stored, else the suite table.md names as seqlab defines it today."""
    from seqlab.lab.suite import SUITES

    stored = [d["settings"] for d in runs.values() if isinstance(d.get("settings"), dict)]
    if stored:
        keep = {k: v for k, v in stored[0].items() if not isinstance(v, dict | list)}
        entries = [s["entry"] for s in stored if isinstance(s.get("entry"), dict)]
        return {**keep, "entries": entries}, "<p>As the run files in runs/ stored them.</p>"
    named = re.search(r"^# seqlab compare --suite (\S+)", table, re.MULTILINE)
    if named and named.group(1) in SUITES:
        note = (
            f"<p>This folder did not store its settings: these are the {named.group(1)} suite's as this "
            "version of seqlab defines it.</p>"
        )
        return dataclasses.asdict(SUITES[named.group(1)]), note
    return None, "<p>This folder stores no settings beyond what its table says above.</p>"


def _settings_html(meta: dict[str, Any], runs: dict[str, Any], table: str) -> str:
    """The suite's settings from settings.json, else :func:`_stored_suite`."""
    suite, note = meta.get("suite"), ""
    if suite is None:
        suite, note = _stored_suite(runs, table)
        if suite is None:
            return note
    top = {k: v for k, v in suite.items() if k != "entries"} | {k: v for k, v in meta.items() if k == "jobs"}
    if "mixers" in meta:
        top["mixers"] = ", ".join(meta["mixers"])
    out = [note, _key_values(top)]
    entries = suite.get("entries") or []
    if entries:
        cols = ["task", "setting", "steps", "lr", "metric", "task_args"]
        head = "".join(f"<th>{c}</th>" for c in cols)
        unique = {json.dumps(e, sort_keys=True): e for e in entries}.values()
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_text(e.get(c, '')))}</td>" for c in cols) + "</tr>"
            for e in unique
        )
        out.append(f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>")
    return "\n".join(out)


def _key_values(pairs: dict[str, Any]) -> str:
    """A two-column table: each key as a row header, its value as text."""
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(_text(v))}</td></tr>" for k, v in pairs.items()
    )
    return f"<div class='scroll'><table>{rows}</table></div>"


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


def _machine(meta: dict[str, Any], table: str) -> dict[str, str]:
    """CPU, threads and torch from settings.json, else what the table's text says."""
    if isinstance(meta.get("machine"), dict):
        return {k: str(v) for k, v in meta["machine"].items()}
    found = {}
    if m := re.search(r"Measured on (.+?), torch ([^\s;,]+)", table):
        found["CPU"], found["torch"] = m.group(1), m.group(2)
    elif m := re.search(r"torch (\d[\w.+]*)", table):
        found["torch"] = m.group(1)
        if cpu := re.search(r"^# .*, ((?:AMD|Intel|Apple|Arm|ARM|NVIDIA)[^,\n]*)$", table, re.MULTILINE):
            found["CPU"] = cpu.group(1)
    if m := re.search(r"with (\d+) threads", table):
        found["threads (speed and memory)"] = m.group(1)
    if m := re.search(r"(one|\d+) (?:torch )?threads? (?:each|per run)", table):
        found["threads per training run"] = m.group(1)
    return found or {"machine": "not recorded in this folder"}


# ---- the page ----------------------------------------------------------------------------------------------


def write_report_html(
    out_dir: str | Path, suite=None, mixers: list[str] | None = None, jobs: int | None = None, made=None
) -> Path:
    """``out_dir/report.html`` from the folder's files; with ``suite`` (as ``seqlab compare`` passes it) first
    write ``settings.json`` with the suite, the mixers, the jobs and this machine; with ``made`` (plots, run
    keys), only the plots and runs of the compare that made them, not those earlier compares left in the
    folder. Returns the page's path."""
    folder = Path(out_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder: give the result folder of a `seqlab compare`")
    if suite is not None:
        from seqlab.lab.records import write_settings

        write_settings(folder, suite, mixers, jobs)
    table_path = folder / "table.md"
    table = table_path.read_text(encoding="utf-8") if table_path.is_file() else ""
    rows = _read_json(folder / "results.json")
    rows = rows if isinstance(rows, list) else []
    plots, keys = made if made is not None else (None, None)
    runs, meta = _read_runs(folder, keys), _read_json(folder / "settings.json") or {}
    title = next(
        (ln[2:].strip() for ln in table.splitlines() if ln.startswith("# ")), f"seqlab: {folder.name}"
    )
    swatches = "".join(f"<span class='swatch fam-{f}'>{f}</span>" for f in FAMILY_COLOURS)
    body = [
        f"<h1>{_inline(title)}</h1>",
        f"<p>Families: {swatches} (table cells and plot colours)</p>",
        markdown_to_html(re.sub(r"^# .*\n", "", table, count=1)) if table else "<p>No table.md here.</p>",
        "<h2>Plots</h2>",
        _figures(folder, plots),
        "<h2>Timings: spread over repeats</h2>",
        _timings(rows, runs),
        "<h2>Settings</h2>",
        _settings_html(meta, runs, table),
        "<h2>Machine</h2>",
        _key_values(_machine(meta, table)),
        f"<p><small>Built by seqlab.lab.report_html from the files of {html.escape(folder.name)}/.</small></p>",
    ]
    page = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}{_family_css()}</style></head>"
        "<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    from seqlab.lab.records import write_output

    return write_output(folder / "report.html", page)


def main(argv: list[str] | None = None) -> int:
    """``python -m seqlab.lab.report_html RESULT_DIR [RESULT_DIR ...]``: (re)build each folder's report.html."""
    folders = sys.argv[1:] if argv is None else argv
    if not folders:
        print("usage: python -m seqlab.lab.report_html RESULT_DIR [RESULT_DIR ...]", file=sys.stderr)
        return 2
    for folder in folders:
        print(f"wrote {write_report_html(folder)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
