"""The grokc compiler: frontends, the graph IR, the pass pipeline driver and the CLI."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("grokc")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
