"""An inference node installs grokc without torch, TVM or onnx: ``grokc run`` and ``grokc serve`` work
in fresh interpreters that cannot import them (nor gguf or transformers, the compiler's), import
nothing of the compiler, and ``grokc build`` there ends with one line naming the install command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_ONLY = ("torch", "tvm", "onnx", "onnxruntime", "gguf", "transformers")

BLOCK = f"""
import atexit, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {BUILD_ONLY!r}:
            raise ModuleNotFoundError('blocked: ' + name)
sys.meta_path.insert(0, Block())
def report():
    loaded = sorted(m for m in sys.modules if m.split('.')[0] in {BUILD_ONLY!r}
                    or m.startswith(('grokc.compiler', 'grokc.passes', 'grokc.targets')))
    print('LOADED:', loaded, file=sys.stderr)
atexit.register(report)
"""
CLI = "from grokc.cli.app import main; sys.argv = ['grokc'] + sys.argv[1:]; main()"


def blocked(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + CLI, *args], capture_output=True, text=True, timeout=300)


def test_run_without_the_compiler(tiny_serving_artifact, tiny_runner):
    out = blocked("run", str(tiny_serving_artifact), "-p", "t5 t6 t7", "-n", "6", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "t5 t6 t7" + tiny_runner.generate("t5 t6 t7", max_new_tokens=6) + "\n"
    assert "LOADED: []" in out.stderr


def test_serve_without_the_compiler(start_server, tiny_serving_artifact, reference):
    server = start_server(tiny_serving_artifact, "--model-name", "tiny", prefix=BLOCK)
    status, body = server.post("/v1/completions", {"model": "tiny", "prompt": "t5 t6 t7", "max_tokens": 5,
                                                   "temperature": 0})
    assert status == 200 and body["choices"][0]["text"] == reference([5, 6, 7], 5)[0]
    assert server.stop() == 0
    assert "LOADED: []" in server.stderr()


def test_build_without_its_extra_names_the_install_command(tmp_path):
    out = blocked("build", str(tmp_path), "-o", str(tmp_path / "out"))
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if not line.startswith("LOADED:")]
    assert lines == ["grokc: error: `grokc build` needs torch, gguf, not installed here; install them with: "
                     "pip install 'grokc[build]'"]


@pytest.mark.slow
def test_the_serve_extra_resolves_without_torch_tvm_onnx(tmp_path):
    """pip itself resolves what `pip install 'grokc[serve]'` would install (needs the package index)."""
    report = tmp_path / "report.json"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                          "--report", str(report), f"{ROOT}[serve]"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"grokc", "numpy", "tokenizers", "starlette", "uvicorn", "cuda-python"} <= names
    assert not names & {"torch", "tvm", "apache-tvm", "onnx", "onnxruntime", "gguf", "transformers", "triton"}, names
