"""``python -m replica_lens.benchmark essential``: the essential pass as its own process (the benchmark times it)."""
from __future__ import annotations

import sys

from replica_lens.benchmark.essential import _essential_main

if __name__ == "__main__":
    if sys.argv[1:2] != ["essential"]:
        sys.exit("usage: python -m replica_lens.benchmark essential --snapshot DIR --out DIR [...]; the benchmark itself is `replica-lens benchmark`")
    sys.exit(_essential_main(sys.argv[2:]))
