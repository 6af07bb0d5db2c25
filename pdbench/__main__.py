"""``python -m pdbench [VERB] [+experiment=NAME] [key=value ...]``; ``--help`` says more.

``--help`` prints pdbench's own page (``pdbench.help``) without importing Hydra or the
driver; everything else goes to ``pdbench.cli.main``: every job of the command line is
composed and validated once, before any runs (a bad key, preset or value prints its
message alone and exits 2; ``--debug`` or ``PDBENCH_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import sys

from pdbench.help import help_page, help_requested, version_requested, version_text

if __name__ == "__main__":
    if help_requested(sys.argv[1:]):
        print(help_page())
    elif version_requested(sys.argv[1:]):
        print(version_text())
    else:
        from pdbench.cli import main

        main(sys.argv[1:])
