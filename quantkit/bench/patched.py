"""A modified copy of a kernel module for the experiments under docs/bench: the module's source with text
replacements applied, written to a temporary file and imported under a name of its own, so that the product's kernels
and the modified ones build and run side by side in one process (Triton's JIT caches by source, so they never share
a binary). Used for instrumented builds (stamps of ``%globaltimer``) and for variants an A/B times against the
product."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType


def patched_copy(module: ModuleType, name: str, patches: list[tuple]) -> ModuleType:
    """Import ``module``'s source under ``name`` with each (old, new) or (old, new, count) of ``patches`` replaced;
    each ``old`` must occur exactly ``count`` times (default once), so that a change to the module fails loudly
    instead of leaving a patch unapplied."""
    src = Path(module.__file__).read_text()
    for old, new, *count in patches:
        want = count[0] if count else 1
        if src.count(old) != want:
            raise SystemExit(f"{Path(module.__file__).name} changed: {old[:60]!r} is there {src.count(old)} times, "
                             f"not {want}; update the patches")
        src = src.replace(old, new)
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # Triton's JIT looks the module up there
    spec.loader.exec_module(mod)
    return mod
