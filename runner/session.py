"""``Runner``: the Python API of the runner — open an artifact, generate text.

    from grokc.runner import Runner
    r = Runner("dist/smollm2")                      # the GPU when there is one, else the CPU
    print(r.generate("The capital of France is", max_new_tokens=16))

Opening checks every file's hash, picks the device (an exact compute-capability match among the
artifact's archs), uploads the weights and builds the CUDA graphs once; ``generate`` then only
writes per-step inputs and replays graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from grokc.artifacts.store import Artifact, open_artifact
from grokc.core.errors import GrokcError, RequestTypeError
from grokc.runner.engine import Engine, SamplingParams
from grokc.runner.executor import Executor

DEVICES = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class Backend:
    device: str   # "cuda" or "cpu"
    arch: str     # the arch whose plan runs


def choose_backend(artifact: Artifact, device: str) -> Backend:
    """Resolve ``auto``/``cuda``/``cpu`` against the machine and the artifact's archs."""
    if device not in DEVICES:
        raise GrokcError(f"unknown --device '{device}'; choose one of: {', '.join(DEVICES)}")
    archs = {name: info.ptx for name, info in artifact.manifest.archs.items()}
    if device == "cpu":
        return Backend("cpu", min(archs))
    from grokc.runner import gpu  # the GPU side needs cuda-python; the CPU side does not
    try:
        return Backend("cuda", gpu.check_device(archs))
    except gpu.NoCudaDevice:
        if device == "cuda":
            raise
        return Backend("cpu", min(archs))


def make_executor(artifact: Artifact, backend: Backend) -> Executor:
    """The backend's executor with every weight in place (synthetic ones filled by ``init``)."""
    plan, weights, synthetic = artifact.plan(backend.arch), artifact.weights(), artifact.synthetic()
    if backend.device == "cpu":
        from grokc.runner.cpu import CpuExecutor
        executor = CpuExecutor(plan, {**weights, **{n: np.zeros(t.shape, t.dtype) for n, t in synthetic.items()}})
    else:
        from grokc.runner.gpu import GpuExecutor
        executor = GpuExecutor(plan, {**weights, **synthetic}, artifact.kernels(backend.arch))
    if "init" in plan.graphs:
        executor.replay("init")
    return executor


class Runner:
    def __init__(self, path: str | Path, device: str = "auto", verify: bool = True):
        self.artifact = open_artifact(path, verify=verify)
        self.backend = choose_backend(self.artifact, device)
        self.executor = make_executor(self.artifact, self.backend)
        self.plan = self.artifact.plan(self.backend.arch)
        self.engine = Engine(self.executor, self.plan, self.artifact.manifest.shapes)
        self.tokenizer = Tokenizer.from_str(self.artifact.tokenizer_json())

    @property
    def device(self) -> str:
        return self.backend.device

    @property
    def synthetic(self) -> bool:
        """True when the weights are seeded random numbers (a speed artifact): the text is noise."""
        return self.artifact.manifest.weights.synthetic is not None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        return self.engine.generate(prompts, params)

    def generate(self, prompt: str | list[str], max_new_tokens: int = 32, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> str | list[str]:
        """Continuations of ``prompt`` (one string, or a list served ``batch`` at a time).

        Bad arguments raise ``RequestTypeError`` (a ``TypeError``) or ``RequestError`` (a
        ``ValueError``) before anything runs; ``seed`` is in ``[0, 2**32)``.
        """
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise RequestTypeError(f"prompt must be a string or a non-empty list of strings, not {prompt!r:.80}")
        for p in prompts:
            if not isinstance(p, str):
                raise RequestTypeError(f"every prompt must be a string, not {type(p).__name__} {p!r:.80}")
        params = SamplingParams(max_new_tokens, temperature, top_k, top_p, seed)
        outs = [self.decode(ids) for ids in self.generate_ids([self.encode(p) for p in prompts], params)]
        return outs[0] if isinstance(prompt, str) else outs

