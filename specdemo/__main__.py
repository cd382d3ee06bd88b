"""``python -m specdemo``: see :mod:`specdemo.interfaces.cli`."""

from .interfaces.cli import main

raise SystemExit(main())
