"""bench/, bench/probes/ and scripts/ are folders of scripts, not packages: the tests here import them
by name, as the scripts import each other when run (``python3 bench/probes/trace_plan.py`` finds
``profile_plan`` beside it)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for folder in (ROOT / "bench", ROOT / "bench" / "probes", ROOT / "scripts"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
