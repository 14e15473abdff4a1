"""The grokc runner: loads an artifact and serves it (CUDA graphs on a GPU, numpy on a CPU).

Imports only numpy, cuda-python and tokenizers (and ``grokc.artifacts``); never torch, TVM or
onnx, so an inference node needs nothing else.
"""

from grokc.runner.engine import SamplingParams
from grokc.runner.session import Runner

__all__ = ["Runner", "SamplingParams"]
