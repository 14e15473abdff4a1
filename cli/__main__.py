"""``python -m grokc.compiler`` = the ``grokc`` command (for checkouts that are not installed)."""

from grokc.cli.app import main

main()
