"""``python -m specdemo``: see :mod:`specdemo.cli`."""

from .cli import main

raise SystemExit(main())
