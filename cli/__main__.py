"""``python -m grokc.cli`` = the ``grokc`` command (for checkouts that are not installed: scripts/device_env.sh)."""

from grokc.cli.app import main

main()
