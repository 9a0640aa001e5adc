"""Stack traces the engine keeps: the program's own frames, not the event loop's.

The engine stores, with every resource, the Python stack that registered it (`stackTrace`, from the SDK's
`_get_stack_trace`). Under the language host that is some 17 frames of which the last dozen are asyncio's, the
SDK's and the language host's own, the same for every resource: about 1.4 KB a resource, 19 KB of a GPU
host's state, written again at every checkpoint (issue 55). `trim_stack_traces` keeps the frames a person
reads (the program's and its libraries', the first of them the source position) and drops those.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlparse

import pulumi
import pulumi.runtime.resource as _resource

# Folders whose frames are the machinery's: the standard library's and the SDK's (computed once: this runs
# for every frame of every resource).
_MACHINERY = tuple({sysconfig.get_paths()["stdlib"] + os.sep, sysconfig.get_paths()["platstdlib"] + os.sep,
                    str(Path(pulumi.__file__).resolve().parent) + os.sep})
_HOST = "pulumi-language-python-exec"           # the language host's runner, which calls the program


def foreign(uri: str) -> bool:
    """A frame of the machinery around the program: the standard library (asyncio), the Pulumi SDK, the
    language host's runner; or one with no position."""
    if not uri:
        return True
    path = unquote(urlparse(uri).path)
    return path.startswith(_MACHINERY) or os.path.basename(path) == _HOST


def _trimming(original: Callable[[], Any]) -> Callable[[], Any]:
    def stack_trace() -> Any:
        trace = original()
        kept = [f for f in trace.frames if not foreign(f.pc.uri)]
        del trace.frames[:]
        trace.frames.extend(kept)
        return trace
    stack_trace.trims = original      # type: ignore[attr-defined]
    return stack_trace


def trim_stack_traces() -> bool:
    """From now on, resources this process registers carry only their program's frames. Call it once, before
    the first resource (again: nothing more happens). False where the SDK has no such hook (another version
    than the pinned one): its full traces are stored, nothing else changes."""
    current = getattr(_resource, "_get_stack_trace", None)
    if current is None:
        return False
    if not hasattr(current, "trims"):
        _resource._get_stack_trace = _trimming(current)
    return True
