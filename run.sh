#!/bin/sh
# The app on the built-in model, set up first when needed: ./run.sh [app.py flags, e.g. --no-browser]
set -eu
cd "$(dirname "$0")"
scripts/setup.sh app
exec .venv/bin/python app.py "$@"
