"""``grokc inspect``: what an artifact holds, as a dict and as readable text."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from grokc.artifacts.store import open_artifact


def describe(path: Path) -> dict:
    art = open_artifact(path, verify=False)
    m = art.manifest
    body = m.to_json()
    graphs = {}
    for arch in m.archs:
        plan = art.plan(arch)
        graphs[arch] = {
            "arena_bytes": plan.arena_bytes,
            "graphs": {
                name: {"tokens": g.tokens, "launches": len(g.launches),
                       "kernels": dict(sorted(Counter(f"{l.kernel} [{l.rule}]" for l in g.launches).items()))}
                for name, g in plan.graphs.items()
            },
        }
    body["archs"] = sorted(m.archs)
    body["arch_info"] = {a: {k: v for k, v in info.to_json().items() if k != "kernels"} for a, info in m.archs.items()}
    body["tokenizer"] = {k: v for k, v in body["tokenizer"].items() if k != "chat_template"}
    return {**body, "plans": graphs}


def _quality_lines(r: dict) -> list[str]:
    """The build's quality report: the worst genre, then one line per genre."""
    w = r["worst"]
    return [f"quality  worst {w['genre']} ({w['ppl_increase']:+.1%} perplexity), top-1 >= {w['top1_agreement']}, "
            f"KL <= {w['kl_mean']}; {r['tokens']} held-out tokens per genre"] + [
        f"  {name:<14} perplexity {g['ppl_artifact']} vs {g['ppl_reference']} unquantized ({g['ppl_increase']:+.1%}), "
        f"top-1 {g['top1_agreement']}, KL {g['kl_mean']}" for name, g in r["genres"].items()]


def render(info: dict) -> str:
    c, s, q = info["model"], info["shapes"], info["quant"]
    lines = [
        f"grokc artifact (format {info['format_version']}, grokc {info['grokc_version']})",
        f"source   {info['source']['format']}  sha256 {info['source']['sha256'][:16]}…",
        f"model    {c['architecture']}: {c['num_layers']} layers, hidden {c['hidden_size']}, heads {c['num_heads']}/"
        f"{c['num_kv_heads']} x {c['head_dim']}, ffn {c['intermediate_size']}, vocab {c['vocab_size']}",
        f"quant    {q['name']}: {q['weight_format']} linears, group {q['group_size'] or 'per-channel'}, "
        f"{'symmetric' if q['symmetric'] else 'asymmetric'}, {q.get('rounding', 'rtn')}; LM head "
        f"{q.get('lm_head', 'f16')}, embeddings {q.get('embeddings', 'f16')}, norms f16"
        + (f"; fp16 residual {q['fp16_residual']:.3g} of the int4 weights" if q.get("fp16_residual") else "")
        + ("; rotated (quant/rotation.py)" if q.get("rotate") else "")
        + (f"; not rotated: {q['not_rotated']}" if q.get("not_rotated") else ""),
        *(_quality_lines(q["quality"]) if "genres" in q.get("quality", {}) else []),
        f"shapes   batch {s['batch']}, buckets {s['buckets']}, max_seq {s['max_seq']}, "
        f"KV {s['kv_blocks']} blocks x {s['kv_block_size']} tokens",
        *(f"rope     {r['name']}: {r['config']['type']} theta {r['config']['theta']}, table {r['table_length']} "
          f"positions, sha256 {r['table_sha256'][:16]}…" for r in info["rope"]),
        f"passes   {' -> '.join(info['passes'])}",
        *(f"  {arch:<7}{' -> '.join(a['passes'])}" + ("  (+ PTX)" if a["ptx"] else "")
          for arch, a in sorted(info["arch_info"].items())),
        f"weights  {info['weights']['bytes'] / 1e6:.1f} MB" + ("  (SYNTHETIC)" if info["weights"].get("synthetic") else ""),
        "files",
    ]
    lines += [f"  {rel:<28} {f['bytes']:>12,d}  {f['sha256'][:16]}…" for rel, f in sorted(info["files"].items())]
    for arch, p in info["plans"].items():
        lines.append(f"plan {arch}: arena {p['arena_bytes'] / 1e6:.1f} MB")
        for name, g in p["graphs"].items():
            lines.append(f"  {name:<14} {g['launches']:>4} launches")
            lines += [f"      {n:>4} x {k}" for k, n in g["kernels"].items()]
    return "\n".join(lines)
