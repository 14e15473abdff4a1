"""``grokc build``: model file -> artifact folder. The side effects of a build live here.

load (frontend) -> trace (torch.export; a graph frontend hands over the IR of its own graph
instead) -> calibrate (a calibrated recipe: statistics of the
linears' inputs, compiler/calibrate.py) -> passes (pipeline.py) -> quality report and gate
(optional, compiler/quality.py) -> lower per arch -> nvcc per arch -> write the artifact. Every
choice is a function of the inputs and options, so two builds of the same model with the same
options are byte-identical.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from grokc.abi.synthetic import SyntheticTensor
from grokc.artifacts import output_dir, store
from grokc.artifacts.manifest import (
    TOKENIZER,
    WEIGHTS,
    ArchInfo,
    Manifest,
    Source,
    SyntheticSpec,
    TokenizerInfo,
    WeightsInfo,
    kernels_file,
    plan_file,
)
from grokc.artifacts.plan import Plan
from grokc.compiler import __version__, memory_budget, models, quality, synthetic_weights
from grokc.compiler.calibrate import CalibrationOptions, calibrate
from grokc.compiler.frontends import LoadedModel, check_finite, load_model
from grokc.compiler.frontends.config_checks import check_tokenizer
from grokc.compiler.frontends.synthetic import load_config
from grokc.compiler.lower import lower
from grokc.compiler.pipeline import CompileOptions, run_passes, shared_passes, target_passes
from grokc.compiler.text import EVAL_GENRES, Text, eval_texts, paragraphs, user_text
from grokc.compiler.trace import trace_module
from grokc.core import tensors as names
from grokc.core.errors import BuildOptionError, QualityError
from grokc.core.ir import Module, WeightFormat
from grokc.passes.static_shapes import StaticShapes
from grokc.quant import rotation
from grokc.quant.recipe import QUANT, WEIGHT_FORMATS, QuantRecipe
from grokc.targets import Target, build_kernels, get_target
from grokc.targets.rules_tvm import KERNELS_CHOICES

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildOptions:
    archs: tuple[str, ...] = ("sm90",)
    quant: str = "int4"
    group_size: int | None = None     # None: the recipe's own (per output channel for int4)
    symmetric: bool | None = None     # None: the recipe's own
    lm_head: str | None = None        # "fp16", "int8" or "int4"; None: the recipe's own (fp16)
    fp16_residual: float | None = None  # fraction of int4 weights kept as f16 corrections; None: the recipe's (0)
    embeddings: str | None = None     # "fp16", "int8" or "int4"; None: the recipe's own (fp16)
    rotate: bool | None = None        # turn the weights before quantizing (quant/rotation.py); None: the recipe's
    batch: int = 4
    buckets: tuple[int, ...] = (128, 512)
    max_seq: int = 2048
    kv_blocks: int = 0
    deterministic: bool = False       # replay-deterministic, batch-invariant decode (one decode graph, no atomics)
    kernels: str = "auto"             # "auto": the rule lists' measured order; "tvm": Apache TVM's kernels first (rules_tvm)
    check_ir: bool = False
    synthetic_seed: int | None = None  # set: MODEL is a config; weights are seeded and filled at load
    calibration: CalibrationOptions = CalibrationOptions()  # read by calibrated recipes only
    quality_tokens: int = 0           # held-out tokens of the quality report; 0: no report (the CLI's default is 4096)
    quality_context: int = 512
    max_ppl_increase: float | None = None  # fail when perplexity rises by more than this fraction on a genre
    eval_texts: tuple[Path, ...] = ()  # --eval-text: the user's files (or folders), reported beside the shipped genres
    max_memory: int = memory_budget.DEFAULT_BUDGET  # device bytes the arena and weights of one plan may take

    def __post_init__(self) -> None:
        if self.quality_tokens < 0 or self.quality_context < 2:
            raise BuildOptionError(f"--quality-tokens {self.quality_tokens} / --quality-context {self.quality_context}: "
                                   "use tokens >= 0 (0 turns the report off) and a context of at least 2")
        if self.quality_tokens and self.quality_tokens < self.quality_context:
            raise BuildOptionError(f"--quality-tokens {self.quality_tokens} is less than one window of "
                                   f"--quality-context {self.quality_context}; raise it or lower the context")
        if self.max_ppl_increase is not None and not self.quality_tokens:
            raise BuildOptionError("--max-ppl-increase needs the quality report; set --quality-tokens above 0")
        if self.max_ppl_increase is not None and self.max_ppl_increase < 0:
            raise BuildOptionError(f"--max-ppl-increase {self.max_ppl_increase:.1%} must not be negative")
        if self.max_memory <= 0:
            raise BuildOptionError(f"--max-memory {self.max_memory} must be a positive size such as 64GiB")
        if self.kernels not in KERNELS_CHOICES:
            raise BuildOptionError(f"unknown --kernels '{self.kernels}'; choose one of: {', '.join(KERNELS_CHOICES)}")
        if self.eval_texts and not self.quality_tokens:
            raise BuildOptionError("--eval-text is read by the quality report; set --quality-tokens above 0")

    def compile_options(self) -> CompileOptions:
        if self.quant not in QUANT:
            raise BuildOptionError(f"unknown --quant '{self.quant}'; choose one of: {', '.join(QUANT)}")
        for option, value in (("--lm-head", self.lm_head), ("--embeddings", self.embeddings)):
            if value not in (None, *WEIGHT_FORMATS):
                raise BuildOptionError(f"unknown {option} '{value}'; choose one of: {', '.join(WEIGHT_FORMATS)}")
        overrides = {"group_size": self.group_size, "symmetric": self.symmetric,
                     "lm_head": WEIGHT_FORMATS.get(self.lm_head), "fp16_residual": self.fp16_residual,
                     "embeddings": WEIGHT_FORMATS.get(self.embeddings)}
        preset = QUANT[self.quant]
        rotation = {}
        if self.rotate is not None:   # --rotate / --no-rotate: as told (--rotate refuses a model it cannot turn)
            rotation = dict(rotate=self.rotate, rotate_where_supported=False,
                            rotated_tied_head=preset.rotated_tied_head if self.rotate else None)
        if self.lm_head is not None:  # --lm-head: every head, rotated or not
            rotation["rotated_tied_head"] = None
        recipe = replace(preset, **{k: v for k, v in overrides.items() if v is not None}, **rotation)
        _refuse_unused(self, recipe)
        shapes = StaticShapes(self.batch, tuple(self.buckets), self.max_seq, self.kv_blocks, self.deterministic)
        return CompileOptions(shapes, recipe)

    @property
    def targets(self) -> list[Target]:
        """The ``--arch`` targets, constrained to deterministic kernels in a deterministic build, with the
        ``--kernels`` preference."""
        return [replace(get_target(a), deterministic=self.deterministic, kernels=self.kernels)
                for a in dict.fromkeys(self.archs)]


def _refuse_unused(opts: BuildOptions, recipe: QuantRecipe) -> None:
    """Refuse an override that the chosen formats would ignore (a manifest must not record a setting
    that shaped nothing)."""
    int4 = WeightFormat.Q4 in (recipe.weight_format, recipe.lm_head, recipe.embeddings)
    coded = int4 or recipe.lm_head is WeightFormat.Q8
    if opts.group_size is not None and not int4:
        raise BuildOptionError(f"--group-size {opts.group_size} sets int4 scale groups, but --quant {opts.quant} with "
                               f"this --lm-head and --embeddings stores no int4 weights; drop --group-size or choose "
                               "an int4 recipe, --lm-head int4 or --embeddings int4")
    if opts.symmetric is not None and not coded:
        flag = "--symmetric" if opts.symmetric else "--asymmetric"
        raise BuildOptionError(f"{flag} sets how int4 codes (and an int8 LM head's) are stored, but --quant "
                               f"{opts.quant} stores none; drop {flag} or choose an int4 recipe or --lm-head int8")


def build(model_path: str | Path, out: str | Path, opts: BuildOptions, progress: Progress = lambda s: None,
          tokenizer: str | Path | None = None) -> Manifest:
    """Build the artifact for ``model_path`` into ``out`` and return its manifest (``tokenizer``: for
    ONNX and torch.export models, see ``load_model``)."""
    opts.targets   # refuse a bad --arch, option or output folder before any work
    opts.compile_options()
    output_dir.check_output(Path(out), protect=(Path(model_path),))
    progress(f"loading {Path(model_path).name}")
    if opts.synthetic_seed is not None:
        loaded = load_config(model_path, opts.synthetic_seed)
    else:
        loaded = load_model(model_path, progress=progress, tokenizer=tokenizer)
    return build_loaded(loaded, out, opts, progress, source=Path(model_path))


def build_loaded(loaded: LoadedModel, out: str | Path, opts: BuildOptions, progress: Progress = lambda s: None,
                 source: Path | None = None) -> Manifest:
    """Build the artifact of an already loaded model into ``out`` (never over ``source``, the model's path)."""
    protect = () if source is None else (source,)
    output_dir.check_output(Path(out), protect)
    targets = opts.targets
    t0 = time.perf_counter()
    copts = opts.compile_options()
    memory_budget.check_kv(loaded.config, copts.shapes, opts.max_memory)
    model = "the model" if source is None else f"'{source}'"
    check_tokenizer(loaded.tokenizer_json, loaded.config.vocab_size, model)
    if loaded.synthetic_seed is None:
        check_finite(loaded.weights, model)
    copts = replace(copts, quant=copts.quant.for_model(_rotation_refusal(loaded), loaded.config.tie_word_embeddings))
    if copts.quant.not_rotated:
        progress(f"note: --quant {copts.quant.name} rotates where the model allows it; not rotated: "
                 f"{copts.quant.not_rotated}")
    if copts.quant.rotate:
        loaded = _rotated(loaded, progress)
    held_out = _held_out(loaded, opts) if opts.quality_tokens and loaded.synthetic_seed is None else None
    compiled: dict[str, tuple[list[str], bytes]] = {}  # arch -> (kernels, binary) compiled ahead
    if loaded.synthetic_seed is not None:
        if opts.quality_tokens:
            raise BuildOptionError("--synthetic-weights builds have no source weights to measure quality against; "
                                   "set --quality-tokens 0")
        if copts.quant.fp16_residual:
            raise BuildOptionError("--fp16-residual needs real weights to correct; --synthetic-weights builds "
                                   "cannot keep one (drop --fp16-residual)")
        copts = replace(copts, quant=copts.quant.uncalibrated())  # random codes are filled at load: layout only
    elif copts.quant.calibrated and not _carries_all(loaded, copts.quant):
        _check_held_out(opts.calibration.sources(), held_out[0] if held_out else [], progress)
        # The kernels depend on shapes and formats, not on calibrated values: compile them first, so a
        # toolchain problem shows before minutes of calibration (the final plans reuse the binaries).
        progress("compiling kernels before calibration")
        layout = compile_loaded(loaded, replace(copts, quant=copts.quant.uncalibrated()))
        compiled = {t.name: _compile(lower_for(layout, t), t, progress) for t in targets}
        t1 = time.perf_counter()
        copts = replace(copts, calibration=calibrate(loaded, copts.quant, opts.calibration, progress))
        progress(f"calibrated in {time.perf_counter() - t1:.1f} s")
    elif copts.quant.calibrated:   # every int4 weight keeps the source's codes: GPTQ has nothing to do
        progress("every int4 weight is carried from the source's own blocks: no calibration")
        copts = replace(copts, quant=copts.quant.uncalibrated())
    module = compile_loaded(loaded, copts, opts.check_ir, progress)
    check_finite(module.params, "the stored weights (the float16 range is +-65504)")
    if held_out is not None:
        module = _quality_gate(loaded, module, opts, held_out, progress)
    synthetic = {} if loaded.synthetic_seed is None else synthetic_weights.specs(module.params, loaded.synthetic_seed)
    plans, binaries, archs = {}, {}, {}
    for target in targets:
        progress(f"passes and lowering for {target.name}")
        module_t = run_passes(module, target_passes(target), opts.check_ir)
        plan = lower(module_t, target)
        progress(memory_budget.check_plan(plan, memory_budget.weight_bytes(module.params),
                                          memory_budget.kv_bytes(loaded.config, copts.shapes), opts.max_memory))
        if synthetic:  # the fills run first: lowering's own init launches (pack_mlp_tiles) read the weights
            init = synthetic_weights.init_graph(synthetic, target)
            lowered = plan.graphs.get("init")
            if lowered is not None:
                init = replace(init, launches=init.launches + lowered.launches)
            plan = replace(plan, graphs={**plan.graphs, "init": init})
        kernels, binary = compiled.get(target.name, (None, b""))
        if kernels != _kernels(plan):
            kernels, binary = _compile(plan, target, progress)
        plans[target.name], binaries[target.name] = plan, binary
        archs[target.name] = ArchInfo(plan_file(target.name), kernels_file(target.name, target.ptx), target.ptx,
                                      tuple(kernels), module_t.meta.passes[len(module.meta.passes):],
                                      target.deterministic)
    manifest = _manifest(loaded, module, archs, synthetic)
    progress(f"writing {out}")
    stored = {name: a for name, a in module.params.items() if name not in synthetic}
    manifest = store.write(Path(out), manifest, plans, binaries, stored, loaded.tokenizer_json, protect)
    progress(f"done in {time.perf_counter() - t0:.1f} s")
    return manifest


def lower_for(module: Module, target: Target) -> Plan:
    """The plan of a shared module for one target: its own passes, then lowering."""
    return lower(run_passes(module, target_passes(target)), target)


def _kernels(plan: Plan) -> list[str]:
    return sorted({launch.kernel for g in plan.graphs.values() for launch in g.launches})


def _compile(plan: Plan, target: Target, progress: Progress) -> tuple[list[str], bytes]:
    """The plan's kernel symbols and the cubin (fatbin, with PTX) nvcc makes of them for ``target``."""
    kernels = _kernels(plan)
    progress(f"nvcc: {len(kernels)} kernels for {target.name}")
    return kernels, build_kernels(kernels, target)


def compile_loaded(loaded: LoadedModel, copts: CompileOptions, check_ir: bool = False,
                   progress: Progress = lambda s: None) -> Module:
    """Trace a loaded model (or take the IR its graph frontend built) and run the shared passes on
    it (no I/O)."""
    if loaded.module is not None:
        module = loaded.module
    else:
        progress("tracing with torch.export")
        module = trace_module(loaded.config, loaded.weights)
    shift = models.get(loaded.config.architecture).residual_shift
    return run_passes(module, shared_passes(copts, loaded.config.moe is not None, shift), check=check_ir,
                      progress=progress)


def _rotation_refusal(loaded: LoadedModel) -> str | None:
    """Why ``loaded`` cannot be rotated (``_rotated`` refuses it), or None."""
    if loaded.synthetic_seed is not None:
        return "a --synthetic-weights build (no real weights to turn)"
    if loaded.module is not None:
        return f"a {loaded.source_format} graph (it keeps its own weights; build the Hugging Face folder or GGUF)"
    return rotation.refusal(loaded.config)


def _rotated(loaded: LoadedModel, progress: Progress) -> LoadedModel:
    """``loaded`` with its weights turned by ``quant.rotation``; refuses what ``_rotation_refusal`` names."""
    why = _rotation_refusal(loaded)
    if why is not None:
        raise BuildOptionError(f"the rotation (--rotate, --quant int4-rot) cannot turn {why}; drop --rotate "
                               "(the default --quant int4 quantizes it unrotated)")
    progress("rotating the residual stream and the attention values")
    config, weights = rotation.rotated(loaded.config, loaded.weights)
    return replace(loaded, config=config, weights=weights)


def _carries_all(loaded: LoadedModel, recipe: QuantRecipe) -> bool:
    """True when every weight ``recipe`` would round with GPTQ (its int4 linears) keeps codes the
    source stored (``meta.carried``), so calibration would measure statistics nothing reads."""
    carried = {} if loaded.module is None else loaded.module.meta.carried
    if not carried:
        return False
    block = [n for n, a in loaded.weights.items() if a.ndim == 2 and n not in (names.name(names.Tensor.TOKEN_EMBD), names.LM_HEAD)]
    gptq = (block if recipe.weight_format is WeightFormat.Q4 else []) + (
        [names.LM_HEAD] if recipe.lm_head is WeightFormat.Q4 else [])
    return all(n in carried for n in gptq)


def _held_out(loaded: LoadedModel, opts: BuildOptions) -> tuple[list[Text], dict[str, list[list[int]]]]:
    """The quality report's texts (the shipped genres, then each ``--eval-text``) and their windows,
    read before the long steps so that a missing or short text fails at once."""
    texts = eval_texts() + [user_text(Path(p), "--eval-text") for p in opts.eval_texts]
    given = [t.name for t in texts]
    if len(set(given)) < len(given):
        raise BuildOptionError(f"--eval-text {sorted(n for n in given if given.count(n) > 1)[0]} is given twice, "
                               f"or shares its name with a shipped genre ({', '.join(EVAL_GENRES)}); give it once")
    return texts, quality.report_windows(loaded.tokenizer_json, texts, opts.quality_tokens, opts.quality_context)


def _check_held_out(calibration: list[Text], evaluation: list[Text], progress: Progress) -> None:
    """Warn about each evaluation text that shares paragraphs with the calibration text (possible only
    with ``--calib-text`` or ``--eval-text``: the shipped texts share none)."""
    read = set().union(*(paragraphs(t.text) for t in calibration))
    for t in evaluation:
        if shared := len(paragraphs(t.text) & read):
            progress(f"warning: the evaluation text {t.name} shares {shared} of its {len(paragraphs(t.text))} "
                     "paragraphs with the calibration text, so its report is not held out")


def _quality_gate(loaded: LoadedModel, module: Module, opts: BuildOptions,
                  held_out: tuple[list[Text], dict[str, list[list[int]]]], progress: Progress) -> Module:
    """Record the quality report in ``meta.quant.quality``; fail when the worst genre passes ``--max-ppl-increase``."""
    report = quality.build_report(loaded, module, *held_out, progress)
    for name, r in report["genres"].items():
        progress(f"quality: {name}: perplexity {r['ppl_artifact']} vs {r['ppl_reference']} unquantized "
                 f"({r['ppl_increase']:+.1%}), top-1 agreement {r['top1_agreement']:.3f}, KL {r['kl_mean']}")
    worst = report["worst"]
    r = report["genres"][worst["genre"]]
    if opts.max_ppl_increase is not None and worst["ppl_increase"] > opts.max_ppl_increase:
        raise QualityError(
            f"perplexity rose {r['ppl_increase']:.1%} on {worst['genre']} ({r['ppl_reference']} -> {r['ppl_artifact']} on "
            f"{r['positions']} held-out positions), more than --max-ppl-increase {opts.max_ppl_increase:.1%} allows; "
            "choose a grouped recipe (--quant int4-g64) or raise the limit")
    return module.with_(meta=replace(module.meta, quant=replace(module.meta.quant, quality=report)))


def _manifest(loaded: LoadedModel, module: Module, archs: dict[str, ArchInfo],
              synthetic: dict[str, SyntheticTensor]) -> Manifest:
    cfg, meta = loaded.config, module.meta
    return Manifest(
        grokc_version=__version__,
        source=Source(loaded.source_format, loaded.source_sha256),
        model=cfg,
        archs=archs,
        shapes=meta.shapes,
        quant=meta.quant,
        rope=meta.rope,
        tokenizer=TokenizerInfo(TOKENIZER, loaded.chat_template, cfg.bos_token_id, cfg.eos_token_ids),
        passes=meta.passes,
        weights=WeightsInfo(WEIGHTS, synthetic=SyntheticSpec(loaded.synthetic_seed, synthetic) if synthetic else None),
    )
