"""drive: closed-loop autonomous-driving and control harness whose controllers know how sure they are.

The harness imports its sibling packages by their top-level names, `agents`, `datasets` and `sim_bridges`. Two of
those names are also PyPI packages (`datasets` is Hugging Face's, present in most ML environments). Measured in one
venv with Hugging Face `datasets` and an editable drive: `import datasets` gave Hugging Face's package while
`datasets.demonstrations` loaded drive's file through the editable finder — a hybrid that worked by accident, with
drive's `datasets/__init__.py` never run. So importing `drive` binds each sibling name to the package beside it
before anything else can: Hugging Face's `datasets` stays installed and usable in other processes. A process that
has already imported another package of that name cannot hold both, and gets one line that says so.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"

SIBLINGS = ("agents", "datasets", "sim_bridges")


class SiblingConflict(ImportError):
    """Another package of a sibling's name is already imported in this process."""


def _bind_siblings(root: Path) -> None:
    for name in SIBLINGS:
        init = root / name / "__init__.py"
        if not init.is_file():  # an install without the sibling (it would fail at its first import, by name)
            continue
        loaded = sys.modules.get(name)
        if loaded is not None:
            where = getattr(loaded, "__file__", None)
            if where is None or Path(where).resolve() != init.resolve():
                raise SiblingConflict(
                    f"drive needs its own top-level package {name!r} ({init.parent}), but this process already "
                    f"imported another {name!r} ({where}); import drive before it, or use the two in separate "
                    "processes"
                )
            continue
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None and Path(spec.origin).resolve() == init.resolve():
            continue  # the ordinary import finds ours
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


_bind_siblings(Path(__file__).resolve().parent.parent)
