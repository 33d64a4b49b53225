"""python select.py [ckpt_path=...] [overrides]: the selection stage alone (lipt.stages.select.run).

This file's name shadows the standard library's `select` module (which `subprocess` imports) in
every Python process whose first sys.path entry is the repository root: `python train.py`,
`python -m pytest`, DDP ranks, launcher jobs, DataLoader workers. When it is imported as
`select`, it hands the real standard module over in its place; this is the one place that
neutralises the shadowing (tests/test_entrypoints.py covers it).
"""

if __name__ == "select":
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _here = os.path.dirname(os.path.abspath(__file__))
    _path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    _spec = importlib.machinery.BuiltinImporter.find_spec("select") or (
        importlib.machinery.PathFinder.find_spec("select", _path)
    )
    if _spec is None or _spec.loader is None:
        raise ImportError("the standard library's select module was not found")
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["select"] = _module  # the import statement returns sys.modules["select"]
    _spec.loader.exec_module(_module)
elif __name__ == "__main__":
    from lipt.run.cli import select_main

    select_main()
