"""The README a newcomer scans: its two commands first, no paragraph past 160 words, its links
resolving, its model table naming what ftlab.models loads, and its generated sections (the op
table, the results tables) equal to what benchmarks/readme_results.py renders from the routing
table and the committed results -- so a hand edit, or a result file moved away, fails here."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from ftlab.models.loader import GGUF_ARCHS
from ftlab.models.tiny import TINY_MODELS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_WORDS = 160


def _load_script():
    path = ROOT / "benchmarks" / "readme_results.py"
    spec = importlib.util.spec_from_file_location("readme_results", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


rr = _load_script()


def paragraphs(text: str) -> list[str]:
    """The prose of a Markdown text: blocks between blank lines, each list item on its own,
    without code fences, tables, headings or comments."""
    out, block, fenced = [], [], False
    for line in [*text.splitlines(), ""]:
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith(("|", "#", "<!--")):
            continue
        if not line.strip() or re.match(r"\s*([-*]|\d+\.)\s", line):
            if block:
                out.append(" ".join(block))
            block = [line] if line.strip() else []
        else:
            block.append(line)
    return out


def test_paragraphs_are_short():
    long = [p[:60] for p in paragraphs(README.read_text()) if len(p.split()) > MAX_WORDS]
    assert long == [], f"README paragraphs over {MAX_WORDS} words: split them"


def test_paragraphs_counts_what_it_should():
    text = "# t\n\none two\nthree\n\n```sh\nfour five six\n```\n| a | b |\n- x y\n- z\n"
    assert [len(p.split()) for p in paragraphs(text)] == [3, 3, 2]


def test_the_two_commands_come_first():
    lines = README.read_text().splitlines()
    assert lines[0] == "# ftlab" and lines[1] == "" and lines[2] == "```sh"
    assert lines[3].startswith("make demo ") and lines[4].startswith("make test ")
    assert lines[5] == "```"


def test_generated_sections_are_what_the_script_renders():
    text = README.read_text()
    assert rr.render(text, rr.sections(rr.load_results())) == text, (
        "README.md differs from benchmarks/readme_results.py's rendering: run it with --write"
    )


def test_check_fails_on_a_hand_edit_and_write_mends_it(tmp_path, capsys):
    readme = tmp_path / "README.md"
    text = README.read_text()
    readme.write_text(text.replace("(90.6%)", "(96.0%)", 1))
    assert readme.read_text() != text
    assert rr.main(["--check", "--readme", str(readme)]) == 1
    assert "run it with --write" in capsys.readouterr().out
    assert rr.main(["--write", "--readme", str(readme)]) == 0
    assert readme.read_text() == text
    assert rr.main(["--check", "--readme", str(readme)]) == 0


def test_render_needs_its_markers():
    with pytest.raises(ValueError, match="results:begin"):
        rr.render("# no markers\n", {"results": "x"})
    assert rr.render("a\n<!-- s:begin -->\nold\n<!-- s:end -->\nb", {"s": "new"}) == (
        "a\n<!-- s:begin -->\nnew\n<!-- s:end -->\nb"
    )


def test_op_table_names_every_op_and_its_backends():
    from ftlab import backends

    table = README.read_text().split("<!-- ops:begin -->")[1].split("<!-- ops:end -->")[0]
    for op in backends.ops():
        row = next(line for line in table.splitlines() if f"| `{op}` |" in line)
        assert all(b in row for b in backends.spec(op).impls), row


def test_model_table_names_every_tiny_model_and_gguf_architecture():
    section = README.read_text().split("\n## Models\n")[1].split("\n## ")[0]
    missing = [n for n in [*TINY_MODELS, *GGUF_ARCHS] if f"`{n}`" not in section]
    assert missing == []


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_resolve():
    text = README.read_text()
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links
    for link in links:
        path, _, anchor = link.partition("#")
        assert (ROOT / path).exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, link


# --- the row rules, on results written here -------------------------------------------------

UP = "user path"


def _m(case, backend="auto", mode="graph", kind=None, validated=True):
    row = dict(case=case, backend=backend, mode=mode, time_us=100.0, validated=validated)
    return {**row, "pct_of_copy": 50.0, **({"kind": kind} if kind else {})}


def _write(folder, file, device, date, rows, name="model-gguf-m"):
    dev = {"name": device, "arch": "sm_90", "date": date, "commit": f"c-{date}"}
    data = {"name": name, "device": dev, "copy_gbps": 4000.0, "notes": [], "results": rows}
    (folder / file).write_text(json.dumps(data))


def test_user_path_rows_keep_each_device_apart_and_take_the_newest_run(tmp_path):
    old = [_m("decode batch 1: 100 tokens/s", kind=UP)]
    _write(tmp_path, "h200-old.json", "NVIDIA H200", "2026-12-01", old)
    h200 = [
        _m("prefill 512 tokens: 9000 tokens/s", kind=UP),
        _m("prefill 512 tokens: 10000 tokens/s", kind="diagnostic"),
        _m("prefill 512 tokens: 6000 tokens/s", backend="llama.cpp", mode="llama-bench"),
    ]
    _write(tmp_path, "h200.json", "NVIDIA H200", "2026-12-06", h200)
    h100 = [_m("prefill 512 tokens: 7000 tokens/s", kind=UP)]
    _write(tmp_path, "h100.json", "NVIDIA H100 80GB HBM3", "2026-12-07", h100)
    (tmp_path / "sweep.json").write_text(json.dumps({"device": {}, "rows": []}))
    results = rr.load_results(tmp_path)
    assert sorted(results) == ["h100.json", "h200-old.json", "h200.json"]
    rows = rr.user_path_rows(results)
    assert [r[1:6] for r in rows] == [
        ["prefill 512 tokens", "7000 tokens/s", "-", "-", "NVIDIA H100 80GB HBM3 (sm_90)"],
        ["prefill 512 tokens", "9000 tokens/s", "6000 tokens/s", "1.50x", "NVIDIA H200 (sm_90)"],
    ]
    assert "h100.json" in rows[0][-1] and "h200.json" in rows[1][-1]
    section = rr.results_section({**rr.load_results(), **results})
    assert "None committed yet" not in section and "| 1.50x |" in section


def test_a_kernel_row_reads_one_file_in_one_mode(tmp_path):
    _write(tmp_path, "k.json", "NVIDIA H200", "2026-12-01", [_m("c", "hip"), _m("c", "triton")])
    row = rr.kernel_row(rr.load_results(tmp_path), rr.Kernel("op", "what", "k.json", "c"))
    assert row[2:5] == [
        "hip 100.0 us (50.0%) · triton 100.0 us (50.0%)",
        "copy 4000 GB/s (100%)",
        "graph replay",
    ]


REFUSED = {
    "peer timed otherwise": ("c", "peer", "must hold one such measurement"),
    "unvalidated": ("u", None, "must be validated"),
    "labelled user path": ("d", None, "kind must be one of"),
}


@pytest.mark.parametrize("why", REFUSED)
def test_kernel_rows_refuse_what_they_must_not_show(tmp_path, why):
    rows = [_m("c", "hip"), _m("c", "triton"), _m("c", "peer", mode="eager")]
    rows += [_m("u", "hip", validated=False), _m("u", "triton")]
    rows += [_m("d", "hip", kind=UP), _m("d", "triton")]
    _write(tmp_path, "k.json", "NVIDIA H200", "2026-12-01", rows)
    case, peer, message = REFUSED[why]
    with pytest.raises(ValueError, match=message):
        rr.kernel_row(rr.load_results(tmp_path), rr.Kernel("op", "w", "k.json", case, peer=peer))


def test_rows_refuse_a_missing_file_and_a_user_path_row_as_diagnostic(tmp_path):
    rows = [_m("prefill 512 tokens: 9 tokens/s", kind=UP)]
    _write(tmp_path, "m.json", "NVIDIA H200", "2026-12-01", rows)
    results = rr.load_results(tmp_path)
    with pytest.raises(ValueError, match="file must be a result"):
        rr.kernel_row(results, rr.Kernel("op", "what", "gone.json", "c"))
    with pytest.raises(ValueError, match="kind must be one of"):
        rr.diagnostic_row(results, rr.Diagnostic("m.json", "prefill 512 tokens", "graph", "what"))


def test_committed_rows_are_labelled_and_one_file_each():
    results = rr.load_results()
    for g in rr.DIAGNOSTICS:
        assert rr.diagnostic_row(results, g)[0] == "diagnostic"
    for k in rr.KERNELS:
        d = results[k.file]["device"]
        device = f"{d['name']} ({d['arch']})"
        run = f"{d['date']} · `{d['commit']}`"
        link = f"[{k.file}](benchmarks/results/{k.file})"
        assert rr.kernel_row(results, k)[5:] == [device, run, link]
