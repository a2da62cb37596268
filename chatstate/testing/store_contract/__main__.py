"""The child writer of the crash and race cases (``_crashes._child`` runs it)."""

import sys

from chatstate.testing.store_contract._crashes import _main

_main(sys.argv[1:])
