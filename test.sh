#!/bin/sh
# The tests, set up first when needed: ./test.sh [pytest arguments, e.g. -m "not slow"]
set -eu
cd "$(dirname "$0")"
scripts/setup.sh test
exec .venv/bin/python -m pytest -q "$@"
