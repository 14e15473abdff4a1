"""The runner imports without torch, TVM or onnx (an inference node has none of them)."""

import subprocess
import sys

BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'tvm', 'onnx', 'transformers', 'safetensors'):
            raise ImportError('blocked: ' + name)
        return None
sys.meta_path.insert(0, Block())
import grokc.runner, grokc.runner.cpu, grokc.runner.gpu, grokc.runner.engine, grokc.artifacts.store
from grokc.runner import Runner
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tvm', 'onnx'))
assert not loaded, loaded
print('ok')
"""


def test_runner_imports_without_torch_tvm_onnx():
    out = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
