"""``python -m grokc.compiler`` = the ``grokc`` command (for checkouts that are not installed)."""

from .cli import main

main()
