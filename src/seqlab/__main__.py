"""``python -m seqlab``: the command line, as the ``seqlab`` script (what torchrun's ``-m seqlab`` runs)."""

import sys

from seqlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
