"""The ``grokc`` command line. Each command parses, calls one library function, prints.

User mistakes raise ``GrokcError`` and are printed as one line, ``grokc: error: ...``, with exit
status 1; anything else is a bug and keeps its traceback (``--debug`` shows tracebacks for
everything).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperGroup

from grokc.core.errors import GrokcError

# The click that typer runs on (its own vendored copy in typer >= 0.26, the click package before).
_click_errors = sys.modules[typer.BadParameter.__module__]


@contextlib.contextmanager
def _usage_errors_on_one_line():
    """Click's usage errors (an unknown option, ``--batch abc``, a missing argument) as one line
    ``grokc: error: ...`` and exit status 2; ``grokc`` alone still prints the help."""
    try:
        yield
    except getattr(_click_errors, "NoArgsIsHelpError", ()):
        raise
    except _click_errors.UsageError as e:
        where = e.ctx.command_path if e.ctx is not None else "grokc"
        typer.echo(f"grokc: error: {_one_line(e.format_message()).rstrip('.')}; see '{where} --help'", err=True)
        raise typer.Exit(2) from None


class _Group(TyperGroup):
    def make_context(self, *args, **kwargs):
        with _usage_errors_on_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _usage_errors_on_one_line():
            return super().invoke(ctx)


app = typer.Typer(
    help="grokc: compile a Llama-family model ahead of time into a GPU artifact, and run it.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=_Group,
)

DEBUG = {"on": False}


def _user_errors(command):
    """Turn a GrokcError into one line on stderr and exit status 1 (a traceback with --debug)."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except GrokcError as e:
            if DEBUG["on"]:
                raise
            typer.echo(f"grokc: error: {_one_line(str(e))}", err=True)
            raise typer.Exit(code=1)
    return wrapper


def _one_line(text: str) -> str:
    return text.strip().replace("\r", "\\r").replace("\n", "\\n")


# What each optional part needs beyond the base install, by the extra that installs it (pyproject.toml).
EXTRAS = {"build": ("torch", "gguf"), "serve": ("starlette", "uvicorn", "jinja2")}


def _require_extra(extra: str, command: str) -> None:
    """One line naming the install command when an extra's packages are missing (nothing imported)."""
    def missing(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is None
        except ImportError:
            return True
    absent = [m for m in EXTRAS[extra] if missing(m)]
    if absent:
        raise GrokcError(f"`grokc {command}` needs {', '.join(absent)}, not installed here; "
                         f"install them with: pip install 'grokc[{extra}]'")


def _progress(msg: str) -> None:
    typer.echo(f"[grokc] {msg}", err=True)


def _csv_ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise GrokcError(f"{option} '{text}' must be comma-separated integers, e.g. 128,512") from None


def _fraction(text: str, option: str) -> float:
    """``"10%"`` -> 0.1; ``"0.1"`` -> 0.1."""
    try:
        return float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        raise GrokcError(f"{option} '{text}' must be a percentage such as 10% (or a fraction such as 0.1)") from None


def _recipes_help() -> str:
    from grokc.quant.recipe import QUANT

    return "; ".join(f"{name} ({r.summary})" for name, r in QUANT.items()) + "."


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Full tracebacks; verify the IR after every pass.")):
    DEBUG["on"] = debug


@app.command()
@_user_errors
def build(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="A .gguf file, a Hugging Face folder (config.json + *.safetensors + tokenizer.json), an .onnx file (torch.onnx.export or onnxruntime-genai's model builder) or a torch.export .pt2 file."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="ONNX and .pt2 models: a tokenizer.json or the Hugging Face folder holding one (default: the tokenizer.json beside MODEL)."),
    arch: List[str] = typer.Option(["sm90"], "--arch", help="GPU architecture to build for; repeat for several (sm80, sm86, sm89, sm90, sm100, sm120)."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Artifact folder to write (default: dist/<model name>)."),
    quant: str = typer.Option("int4", "--quant", help="Weight recipe: " + _recipes_help()),
    group_size: Optional[int] = typer.Option(None, "--group-size", help="int4 scale group along the input dim, overriding the recipe's; 0 = one scale per output channel."),
    symmetric: Optional[bool] = typer.Option(None, "--symmetric/--asymmetric", help="int4 codes (and an int8 LM head's) without / with a zero-point per scale (default: the recipe's)."),
    lm_head: Optional[str] = typer.Option(None, "--lm-head", help="LM head weights: fp16 (default), int8 (round to nearest, one scale per output channel, --symmetric/--asymmetric apply; half the bytes a decode step reads for it) or int4 (the recipe's rounding; a quarter)."),
    embeddings: Optional[str] = typer.Option(None, "--embeddings", help="Token embedding table: fp16 (default), int8 (symmetric, one scale per row) or int4 (round to nearest per row, or per --group-size group when it divides the hidden size; --symmetric/--asymmetric apply); a tied fp16 LM head keeps its own fp16 copy."),
    fp16_residual: Optional[str] = typer.Option(None, "--fp16-residual", help="Keep this fraction of each int4 weight's entries, those the int4 grid serves worst, as exact f16 corrections beside the codes, e.g. 0.5% (or 0.005); off by default."),
    rotate: Optional[bool] = typer.Option(None, "--rotate/--no-rotate", help="int4 recipes: turn the residual stream and each head's values by seeded Hadamard rotations before quantizing (the same logits; outliers spread over all inputs, which per-channel int4 serves better); a tied LM head gets its own copy (int8 in the default int4, else fp16 unless --lm-head). Families without post-norms, not MoE. Default: the recipe's (int4 rotates where the model allows it, saying so where not; int4-norot never; int4-rot always)."),
    calib_samples: int = typer.Option(32, "--calib-samples", help="Calibrated recipes: windows of calibration text, dealt out evenly over its sources (the shipped mix of seven genres, or each --calib-text)."),
    calib_text: List[Path] = typer.Option([], "--calib-text", help="Calibrated recipes: calibrate on this UTF-8 file, or every file under this folder, instead of the shipped mix; repeat for several sources."),
    calib_tokens: int = typer.Option(512, "--calib-tokens", help="Calibrated recipes: tokens per calibration window."),
    calib_seed: int = typer.Option(0, "--calib-seed", help="Calibrated recipes: seed that places the windows."),
    sequential: bool = typer.Option(True, "--sequential/--no-sequential", help="Calibrated recipes: calibrate each block on the outputs of the blocks already quantized."),
    quality_tokens: int = typer.Option(4096, "--quality-tokens", help="Held-out tokens of each evaluation genre (shipped: docs, news, fiction, dialogue, encyclopedic; none read by calibration) on which the build reports perplexity, top-1 agreement and KL against the unquantized model, per genre and the worst, in the manifest and --json; 0 = no report."),
    eval_text: List[Path] = typer.Option([], "--eval-text", help="Also report on this UTF-8 file (or every file under this folder) as a genre of its own; repeat for several."),
    quality_context: int = typer.Option(512, "--quality-context", help="Context length of each window of the quality report."),
    max_ppl_increase: Optional[str] = typer.Option(None, "--max-ppl-increase", help="Fail the build when the reported perplexity rises by more than this on any genre, e.g. 10% (or 0.1)."),
    batch: int = typer.Option(4, "--batch", help="Static batch: sequences served at once (decode slots)."),
    buckets: str = typer.Option("128,512", "--buckets", help="Prompt lengths to compile prefill graphs for; a prompt is padded to the smallest that holds it."),
    max_seq: int = typer.Option(2048, "--max-seq", help="Longest sequence (prompt + generated tokens) a slot can hold."),
    kv_blocks: int = typer.Option(0, "--kv-blocks", help="KV-cache blocks of 16 tokens shared by all slots; 0 = batch * max-seq / 16."),
    max_memory: str = typer.Option("64GiB", "--max-memory", help="Refuse a build whose arena (KV cache, buffers) and weights take more device memory than this, e.g. 64GiB, 80G, 500MB."),
    deterministic: bool = typer.Option(False, "--deterministic", help="Replay-deterministic, batch-invariant decode: a request's logits are bitwise the same whatever else is batched and run after run (one decode graph at --batch, no kernels that sum in any order; slower when few slots are busy)."),
    kernels: str = typer.Option("auto", "--kernels", help="Which kernels the rule lists try first: auto (their measured order, hand-written kernels first on sm90) or tvm (Apache TVM's dlight kernels wherever one covers a linear: M = 1 GEMV and M >= 16 GEMM, f16 or per-channel symmetric int4, no norm or activation; needs pip install 'grokc[tvm]'). `grokc inspect` shows each launch's rule."),
    synthetic_weights: bool = typer.Option(False, "--synthetic-weights", help="MODEL is a Hugging Face config.json: store a seeded weight spec the runner fills on the GPU (for speed work; the text is noise)."),
    seed: int = typer.Option(0, "--seed", help="Seed of --synthetic-weights."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON when done."),
):
    """Compile MODEL into an artifact: cubins per arch, graph plans, weights, tokenizer."""
    _require_extra("build", "build")
    from grokc.compiler.build import BuildOptions
    from grokc.compiler.build import build as run_build
    from grokc.compiler.calibrate import CalibrationOptions
    from grokc.compiler.memory_budget import parse_size
    from grokc.quant.recipe import QUANT

    given = [f"--{n.replace('_', '-')}" for n in ("calib_samples", "calib_tokens", "calib_seed", "sequential", "seed")
             if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"]
    unused = [g for g in given if g != "--seed" and quant in QUANT and not QUANT[quant].calibrated]
    if unused:
        raise GrokcError(f"{unused[0]} sets calibration, but --quant {quant} is not calibrated; drop it or choose "
                         "a calibrated recipe (int4, int4-g128, int4-g64)")
    if "--seed" in given and not synthetic_weights:
        raise GrokcError("--seed seeds --synthetic-weights; drop it or add --synthetic-weights")
    opts = BuildOptions(archs=tuple(arch), quant=quant, group_size=group_size, symmetric=symmetric, lm_head=lm_head,
                        embeddings=embeddings, rotate=rotate,
                        fp16_residual=None if fp16_residual is None else _fraction(fp16_residual, "--fp16-residual"),
                        batch=batch, buckets=_csv_ints(buckets, "--buckets"), max_seq=max_seq, kv_blocks=kv_blocks,
                        deterministic=deterministic, kernels=kernels,
                        check_ir=DEBUG["on"], synthetic_seed=seed if synthetic_weights else None,
                        calibration=CalibrationOptions(calib_samples, calib_tokens, calib_seed, sequential, tuple(calib_text)),
                        quality_tokens=0 if synthetic_weights else quality_tokens, quality_context=quality_context,
                        eval_texts=tuple(eval_text),
                        max_ppl_increase=None if max_ppl_increase is None else _fraction(max_ppl_increase, "--max-ppl-increase"),
                        max_memory=parse_size(max_memory))
    out = out or Path("dist") / model.stem.split(".")[0]
    manifest = run_build(model, out, opts, progress=_progress, tokenizer=tokenizer)
    if as_json:
        typer.echo(manifest.to_bytes().decode())
    else:
        typer.echo(f"wrote {out} ({', '.join(manifest.archs)}, {manifest.quant.name}, "
                   f"{manifest.weights.bytes / 1e6:.1f} MB of weights)")


@app.command()
@_user_errors
def run(
    artifact: Path = typer.Argument(..., help="Artifact folder written by `grokc build`."),
    prompt: List[str] = typer.Option(..., "--prompt", "-p", help="Prompt text; repeat to batch several."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", "-n", help="Tokens to generate per prompt."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    top_k: int = typer.Option(0, "--top-k", help="Keep the k most likely tokens (0 = all)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass (1 = off)."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (per request)."),
    device: str = typer.Option("auto", "--device", help="auto (GPU if there is one), cuda, or cpu."),
):
    """Generate continuations of --prompt with the artifact (GPU via CUDA graphs, or CPU)."""
    from grokc.runner import Runner

    r = Runner(artifact, device=device)
    _progress(f"running on {r.device} ({r.backend.arch} plan)")
    if r.synthetic:
        typer.echo("grokc: warning: this artifact has synthetic (random) weights; its output text is noise", err=True)
    outs = r.generate(list(prompt), max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                      top_p=top_p, seed=seed)
    for p, o in zip(prompt, outs):
        typer.echo(p + o)


@app.command()
@_user_errors
def serve(
    artifact: Path = typer.Argument(..., help="Artifact folder written by `grokc build`."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 in a container)."),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0: any free port, printed)."),
    device: str = typer.Option("auto", "--device", help="auto (GPU if there is one), cuda, or cpu."),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML file with a [limits] table (the names below, with underscores); flags win."),
    model_name: Optional[str] = typer.Option(None, "--model-name", help="The model id clients ask for (default: the artifact folder's name)."),
    max_prompt_tokens: Optional[int] = typer.Option(None, "--max-prompt-tokens", help="Longest prompt (default and most: the largest bucket); longer: 400 prompt_too_long."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Largest max_tokens a request may ask (default: max-seq - 1); larger: 400 max_tokens_too_large."),
    max_queue: Optional[int] = typer.Option(None, "--max-queue", help="Requests that may wait for a slot (default 64); one more: 429 queue_full with Retry-After."),
    request_timeout: Optional[float] = typer.Option(None, "--request-timeout", help="Seconds from arrival to the last token (default 60); past it: 504 deadline_exceeded, the slot is freed."),
    max_body_bytes: Optional[int] = typer.Option(None, "--max-body-bytes", help="Largest request body (default 1 MiB); larger: 413 body_too_large."),
    drain_timeout: Optional[float] = typer.Option(None, "--drain-timeout", help="After SIGTERM, seconds requests in flight may still run (default 30)."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Write a Chrome trace (Perfetto) of per-launch times of the first --profile-steps replays of each graph, and print the top launches, at exit."),
    profile_steps: int = typer.Option(20, "--profile-steps", help="Replays of each graph --profile times."),
):
    """Serve the artifact over HTTP: OpenAI-compatible /v1/completions and /v1/chat/completions, /health, /metrics."""
    _require_extra("serve", "serve")
    from grokc.serve.limits import load_limits
    from grokc.serve.server import ServeOptions
    from grokc.serve.server import serve as run_server

    limits = load_limits(config, {"max_prompt_tokens": max_prompt_tokens, "max_new_tokens": max_new_tokens,
                                  "max_queue": max_queue, "request_timeout_s": request_timeout,
                                  "max_body_bytes": max_body_bytes, "drain_timeout_s": drain_timeout})
    run_server(ServeOptions(artifact, host, port, device, model_name, limits, profile, profile_steps), _progress)


@app.command()
@_user_errors
def inspect(
    artifact: Path = typer.Argument(..., help="Artifact folder."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Show what an artifact holds: model, shapes, quantization, RoPE, files, graphs and kernels."""
    from grokc.cli.inspect import describe, render

    info = describe(artifact)
    typer.echo(json.dumps(info, indent=1, sort_keys=True) if as_json else render(info))


@app.command()
@_user_errors
def verify(
    artifact: Path = typer.Argument(..., help="Artifact folder."),
    model: Optional[Path] = typer.Option(None, "--model", help="Source model: also check the artifact's numerics against it."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="With an ONNX or .pt2 --model: the tokenizer it was built with."),
):
    """Check every file's SHA-256; with --model, compare the artifact's logits to the source model."""
    from grokc.cli.verify import verify_artifact

    for line in verify_artifact(artifact, model, progress=_progress, tokenizer=tokenizer):
        typer.echo(line)


@app.command("eval")
@_user_errors
def evaluate(
    artifact: Path = typer.Argument(..., help="Artifact folder."),
    model: Path = typer.Option(..., "--model", help="Source model the artifact was built from (the fp16 reference)."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="With an ONNX or .pt2 --model: the tokenizer it was built with."),
    tokens: int = typer.Option(1024, "--tokens", help="Tokens of each genre's evaluation text."),
    context: int = typer.Option(256, "--context", help="Context length of each evaluated window."),
    genre: List[str] = typer.Option([], "--genre", help="A shipped held-out genre to measure (docs, news, fiction, dialogue, encyclopedic); repeat for several; default: all."),
    eval_text: List[Path] = typer.Option([], "--eval-text", help="Also measure this UTF-8 file (or every file under this folder); repeat for several."),
):
    """Perplexity, top-1 agreement and KL of the artifact (CPU plan) against the unquantized model, per genre."""
    _require_extra("build", "eval")
    from grokc.cli.evaluate import evaluate_artifact
    from grokc.compiler.text import EVAL_GENRES

    result = evaluate_artifact(artifact, model, tokens=tokens, context=context, genres=tuple(genre) or EVAL_GENRES,
                               extra=tuple(eval_text), progress=_progress, tokenizer=tokenizer)
    typer.echo(json.dumps(result, indent=1, sort_keys=True))


@app.command()
@_user_errors
def bench(
    artifact: Path = typer.Argument(..., help="Artifact folder (needs a GPU it was built for)."),
    steps: int = typer.Option(100, "--steps", help="Decode steps timed per measurement."),
    context: int = typer.Option(128, "--context", help="Prompt tokens in the KV cache before decoding."),
    baselines: bool = typer.Option(True, "--baselines/--no-baselines", help="Also time PyTorch eager, eager + CUDA graph and torch.compile on the same shapes."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Then time each launch of some prefill and decode replays with CUDA events: a Chrome trace (Perfetto) to this file and the top launches on stderr."),
):
    """Time load, first token, prefill per bucket and decode (batch 1 and the build's batch); print JSON."""
    from grokc.cli.bench import bench_artifact

    typer.echo(json.dumps(bench_artifact(artifact, steps=steps, context=context, baselines=baselines,
                                         progress=_progress, profile=profile), indent=1, sort_keys=True))


def main() -> None:
    app()
