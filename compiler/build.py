"""``grokc build``: model file -> artifact folder. The side effects of a build live here.

load (frontend) -> trace (torch.export) -> passes (pipeline.py) -> lower per arch -> nvcc per
arch -> write the artifact. Every choice is a function of the inputs and options, so two builds
of the same model with the same options are byte-identical.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from grokc.artifacts import store
from grokc.artifacts.errors import BuildOptionError
from grokc.artifacts.manifest import Manifest
from grokc.passes.quantize import QUANT
from grokc.passes.static_shapes import StaticShapes
from grokc.targets import build_cubin, get_target

from . import __version__, names, synthetic_weights
from .frontends import LoadedModel, load_model
from .frontends.synthetic import load_config
from .ir import Module
from .lower import lower
from .pipeline import CompileOptions, compile_module
from .trace import trace_module

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildOptions:
    archs: tuple[str, ...] = ("sm90",)
    quant: str = "int4"
    group_size: int | None = None     # None: the recipe's own (per output channel for int4)
    batch: int = 4
    buckets: tuple[int, ...] = (128, 512)
    max_seq: int = 2048
    kv_blocks: int = 0
    check_ir: bool = False
    synthetic_seed: int | None = None  # set: MODEL is a config; weights are seeded and filled at load

    def compile_options(self) -> CompileOptions:
        if self.quant not in QUANT:
            raise BuildOptionError(f"unknown --quant '{self.quant}'; choose one of: {', '.join(QUANT)}")
        recipe = QUANT[self.quant]
        if self.group_size is not None:
            recipe = replace(recipe, group_size=self.group_size)
        return CompileOptions(StaticShapes(self.batch, tuple(self.buckets), self.max_seq, self.kv_blocks), recipe)


def build(model_path: str | Path, out: str | Path, opts: BuildOptions, progress: Progress = lambda s: None) -> Manifest:
    """Build the artifact for ``model_path`` into ``out`` and return its manifest."""
    for a in opts.archs:
        get_target(a)   # refuse a bad --arch before any work
    opts.compile_options()
    progress(f"loading {Path(model_path).name}")
    if opts.synthetic_seed is not None:
        loaded = load_config(model_path, opts.synthetic_seed)
    else:
        loaded = load_model(model_path, progress=progress)
    return build_loaded(loaded, out, opts, progress)


def build_loaded(loaded: LoadedModel, out: str | Path, opts: BuildOptions, progress: Progress = lambda s: None) -> Manifest:
    """Build the artifact of an already loaded model into ``out``."""
    targets = [get_target(a) for a in dict.fromkeys(opts.archs)]
    t0 = time.perf_counter()
    module = compile_loaded(loaded, opts.compile_options(), opts.check_ir, progress)
    synthetic = {} if loaded.synthetic_seed is None else synthetic_weights.specs(module.params, loaded.synthetic_seed)
    plans, cubins = {}, {}
    for target in targets:
        progress(f"lowering for {target.name}")
        plans[target.name] = lower(module, target)
        if synthetic:
            init = synthetic_weights.init_graph(synthetic, target)
            plans[target.name] = replace(plans[target.name], graphs={**plans[target.name].graphs, "init": init})
        kernels = sorted({launch.kernel for g in plans[target.name].graphs.values() for launch in g.launches})
        progress(f"nvcc: {len(kernels)} kernels for {target.name}")
        cubins[target.name] = build_cubin(kernels, target)
    manifest = _manifest(loaded, module, plans, synthetic)
    progress(f"writing {out}")
    stored = {name: a for name, a in module.params.items() if name not in synthetic}
    manifest = store.write(Path(out), manifest, plans, cubins, stored, loaded.tokenizer_json)
    progress(f"done in {time.perf_counter() - t0:.1f} s")
    return manifest


def compile_loaded(loaded: LoadedModel, copts: CompileOptions, check_ir: bool = False,
                   progress: Progress = lambda s: None) -> Module:
    """Trace a loaded model and run the pass pipeline on it (no I/O)."""
    weights = {}
    for hf_name, array in loaded.weights.items():
        canonical = names.from_hf(hf_name)
        if canonical is not None:
            weights[canonical] = array
    progress("tracing with torch.export")
    module = trace_module(loaded.config, weights)
    return compile_module(module, copts, check=check_ir, progress=progress)


def _manifest(loaded: LoadedModel, module: Module, plans: dict, synthetic: dict) -> Manifest:
    cfg = loaded.config
    return Manifest(
        grokc_version=__version__,
        source={"format": loaded.source_format, "sha256": loaded.source_sha256},
        model=cfg.to_json(),
        archs=sorted(plans),
        shapes=dict(module.meta["shapes"]),
        quant=dict(module.meta["quant"]),
        rope=dict(module.meta["rope"]),
        tokenizer={"file": "tokenizer.json", "chat_template": loaded.chat_template,
                   "bos_token_id": cfg.bos_token_id, "eos_token_ids": list(cfg.eos_token_ids)},
        passes=list(module.meta["passes"]),
        weights={"file": "weights.safetensors", "synthetic": {
            "seed": loaded.synthetic_seed, "tensors": {n: t.to_json() for n, t in sorted(synthetic.items())},
        } if synthetic else None},
        kernels={arch: sorted({l.kernel for g in p.graphs.values() for l in g.launches}) for arch, p in plans.items()},
    )
