"""The one error family of grokc.

Every mistake a user can make (a missing file, an unsupported model, a bad option, a tampered
artifact, a prompt that does not fit) raises a ``GrokcError`` whose message is one sentence that
names the thing, the value and the fix. The CLI prints it as ``grokc: error: <message>`` and exits
with status 1. Anything else that escapes is a bug and keeps its traceback.

It lives in ``artifacts`` because that is the one package both the compiler and the runner import.
"""


class GrokcError(Exception):
    """A user-facing error: one sentence, printed without a traceback."""


class UnsupportedModel(GrokcError):
    """The model file or its architecture is not something grokc can compile."""


class UnsupportedOp(GrokcError):
    """The traced graph holds an operation grokc has no lowering for."""


class BuildOptionError(GrokcError):
    """A build option is out of range or inconsistent with the model."""


class TargetError(GrokcError):
    """An unknown architecture, a missing toolchain, or a device the artifact was not built for."""


class QualityError(GrokcError):
    """A build whose measured quality is worse than the user allowed (``--max-ppl-increase``)."""


class ArtifactError(GrokcError):
    """An artifact is missing, corrupt, tampered with, or from an incompatible grokc."""


class RequestError(GrokcError, ValueError):
    """A generation request does not fit the artifact (prompt too long, KV cache full, ...) or has a
    value out of range (a NaN temperature); also a ``ValueError``, as Python code expects."""


class RequestTypeError(RequestError, TypeError):
    """A generation request's argument has the wrong type (``temperature="hot"``); also a ``TypeError``."""
