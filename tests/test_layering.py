"""Dependencies point one way (README "Architecture"): every grokc import of every package file is
read from the code and checked against the layer table, and the runner imports with torch, TVM,
onnx and transformers blocked."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# folder -> the grokc folders (or single modules) its files may import, besides itself
ALLOWED = {
    "core": set(),
    "abi": {"core"},
    "artifacts": {"core", "abi"},
    "quant": {"core", "abi"},
    "passes": {"core", "abi", "artifacts", "quant"},
    "targets": {"core", "abi"},
    "compiler": {"core", "abi", "artifacts", "quant", "passes", "targets"},
    "runner": {"core.errors", "core.meta", "abi", "artifacts"},
    "serve": {"core.errors", "core.meta", "abi", "artifacts", "runner"},
    "cli": {"core", "abi", "artifacts", "quant", "passes", "targets", "compiler", "runner", "serve"},
}


def grokc_imports(path: Path) -> set[str]:
    """The dotted grokc modules ``path`` imports (relative imports resolved), without the ``grokc.``."""
    package = path.relative_to(ROOT).parent.parts
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("grokc.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                out.add(".".join(["grokc", *base, *([node.module] if node.module else [])]))
            elif node.module and node.module.startswith("grokc."):
                out.add(node.module)
                out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m.removeprefix("grokc.") for m in out}


def allowed(folder: str, module: str) -> bool:
    if module.split(".")[0] == folder:
        return True
    return any(module == a or module.startswith(a + ".") for a in ALLOWED[folder])


def test_every_folder_imports_only_the_layers_below_it():
    bad = []
    for folder in ALLOWED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for module in sorted(grokc_imports(path)):
                top = module.split(".")[0]
                if top in ALLOWED and not allowed(folder, module):
                    bad.append(f"{path.relative_to(ROOT)} imports grokc.{module}")
    assert not bad, "imports against the layer table:\n" + "\n".join(bad)


def test_the_table_covers_every_package_folder():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench", "scripts", "docs"}
    assert packages <= set(ALLOWED), packages - set(ALLOWED)


def test_a_wrong_import_is_caught(tmp_path):
    """The check itself: a runner file importing the compiler would be reported."""
    assert not allowed("runner", "compiler.build") and not allowed("runner", "core.ir")
    assert not allowed("artifacts", "runner.engine") and not allowed("core", "abi.ops")
    assert allowed("runner", "core.errors") and allowed("passes", "quant.recipe")


BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'tvm', 'onnx', 'transformers'):
            raise ImportError('blocked: ' + name)
        return None
sys.meta_path.insert(0, Block())
import grokc.runner, grokc.runner.cpu, grokc.runner.engine, grokc.artifacts.store
from grokc.runner import Runner
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tvm', 'onnx'))
assert not loaded, loaded
compiler = sorted(m for m in sys.modules if m.startswith(('grokc.compiler', 'grokc.passes', 'grokc.targets', 'grokc.core.ir')))
assert not compiler, compiler
print('ok')
"""


def test_runner_imports_without_torch_tvm_onnx():
    out = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
