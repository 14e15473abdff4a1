#!/usr/bin/env python3
"""The performance table of README.md and docs/performance.md, regenerated from bench/results/*.json.

    python3 scripts/perf_table.py            # rewrite the block between the markers in both files
    python3 scripts/perf_table.py --check    # exit 1 when a file's block differs from the JSON's

Each results file is one run of ``bench/run_bench.py``: ``{"run": {"date", "device", "command", "commit",
and an optional "note"}, "models": {name: the grokc bench JSON of that model}}``. The table has one row
per model, from the newest run that measured it (by date, then file name), and names that run's
machine and date; below it, each file's command and note. The block sits
between ``<!-- perf-table:begin -->`` and ``<!-- perf-table:end -->``; write nothing there by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGES = (ROOT / "README.md", ROOT / "docs" / "performance.md")
BEGIN, END = "<!-- perf-table:begin -->", "<!-- perf-table:end -->"
# run_bench.py's model names, in the table's order
MODELS = {"llama1b": "Llama-3.2-1B shape", "llama1b-sm80+sm90": "Llama-3.2-1B shape, built sm80+sm90",
          "llama1b-det": "Llama-3.2-1B shape, --deterministic",
          "llama1b-h8": "Llama-3.2-1B shape, int8 LM head (a real build's default)", "llama8b": "Llama-3-8B shape",
          "smollm2": "SmolLM2-135M-Instruct", "smollm2-shape": "SmolLM2-135M shape"}
BASELINE = "compile_cudagraph_fp16"   # torch.compile + CUDA graph, the baseline the speedups are against


@dataclass(frozen=True)
class Row:
    model: str      # run_bench's name
    bench: dict     # grokc bench's JSON for it
    run: dict       # the results file's "run"
    file: str       # the results file's name


def load(folder: Path = RESULTS) -> list[Row]:
    """The newest row of each model over the results files in ``folder``, in the table's order."""
    runs = []
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        runs.append((doc["run"]["date"], path.name, doc))
    newest: dict[str, Row] = {}
    for _, name, doc in sorted(runs):
        for model, bench in doc["models"].items():
            newest[model] = Row(model, bench, doc["run"], name)
    order = list(MODELS)
    return sorted(newest.values(), key=lambda r: (order.index(r.model) if r.model in order else len(order), r.model))


def _ms(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f} ms"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def label(r: Row) -> str:
    name = MODELS.get(r.model, r.model)
    return name + (", synthetic weights" if r.bench.get("synthetic_weights") else "")


def decode_row(r: Row) -> str:
    dec, torch = r.bench["grokc"]["decode"], r.bench.get("torch", {})
    one = dec["1"]
    batch = max(dec, key=int)
    frac, roof = one.get("roofline_fraction"), one.get("roofline_ms")
    of_roofline = "-" if frac is None else f"{100 * frac:.1f} % ({roof:.3f} ms)"
    big = dec[batch]
    at_b = "-" if batch == "1" else f"B={batch}: {_ms(big['ms_per_step'])}, {_x(big.get('speedup', {}).get(BASELINE))}"
    cells = [label(r), r.bench["quant"], f"{r.run['device']}, {r.run['date']}", f"{one['ms_per_step']:.3f} ms/step",
             of_roofline, _ms(torch.get("1", {}).get(BASELINE)), _x(one.get("speedup", {}).get(BASELINE)), at_b]
    return "| " + " | ".join(cells) + " |"


def other_row(r: Row) -> str:
    g, torch = r.bench["grokc"], r.bench.get("torch", {}).get("1", {})
    prefill = ", ".join(f"{n}: {_ms(ms, 2)}" for n, ms in sorted(g["prefill_ms"].items(), key=lambda kv: int(kv[0])))
    bw = r.bench.get("copy_bandwidth_GBps")
    cells = [label(r), prefill, "-" if g.get("load_s") is None else f"{g['load_s']:.2f} s", _ms(g.get("ttft_ms"), 2),
             _ms(torch.get("eager_fp16"), 1), _ms(torch.get("eager_cudagraph_fp16")),
             "-" if bw is None else f"{bw:.0f} GB/s"]
    return "| " + " | ".join(cells) + " |"


def render(rows: list[Row]) -> str:
    """The block between the markers (without them)."""
    lines = ["<!-- written by scripts/perf_table.py from bench/results/*.json: edit those, then run it -->",
             "| model | quant | machine, date | grokc decode, batch 1 | of roofline | torch.compile + CUDA graph (fp16) "
             "| speedup | batch B |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [decode_row(r) for r in rows]
    lines += ["", "| model | prefill (bucket: ms) | load | first token | torch eager (fp16) | eager + CUDA graph "
              "| copy bandwidth |", "|---|---|---|---|---|---|---|"]
    lines += [other_row(r) for r in rows]
    lines.append("")
    for file in dict.fromkeys(r.file for r in rows):
        run = next(r.run for r in rows if r.file == file)
        note = f"; {run['note']}" if run.get("note") else ""
        lines.append(f"`bench/results/{file}`: `{run['command']}`{note}.")
    return "\n".join(lines)


def splice(text: str, block: str, where: str = "the page") -> str:
    """``text`` with the block between the markers replaced by ``block``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"perf_table: {where} needs one {BEGIN} line and, after it, one {END} line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page's table is stale")
    a = ap.parse_args(argv)
    block = render(load())
    stale = []
    for page in PAGES:
        text = page.read_text()
        new = splice(text, block, str(page.relative_to(ROOT)))
        if new != text:
            stale.append(str(page.relative_to(ROOT)))
            if not a.check:
                page.write_text(new)
    if a.check and stale:
        print(f"perf_table: {', '.join(stale)} out of date with bench/results; run python3 scripts/perf_table.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
