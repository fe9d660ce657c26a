"""``python -m chaosp2p.hivemind SCRIPT [ARGS...]``: run a hivemind script unchanged on chaosp2p.

The script's ``import hivemind`` lines get the drop-in (:mod:`chaosp2p.hivemind.alias`); the
script runs as ``__main__`` with ``sys.argv`` = ``[SCRIPT, ARGS...]`` and its directory first on
``sys.path``, as ``python SCRIPT ARGS`` would run it.
"""

from __future__ import annotations

import os
import runpy
import sys

from chaosp2p.hivemind.alias import install_alias


def main(argv: list[str]) -> int:
    """Run ``argv[0]`` as a script with the ``hivemind`` alias installed."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m chaosp2p.hivemind SCRIPT [ARGS...]  (runs a hivemind script on chaosp2p)")
        return 0 if argv else 2
    script = argv[0]
    install_alias()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
