"""``python -m jobset_inplace.kubectl_plugin``: the same as ``kubectl jobset-inplace``."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
