"""Checks: compatibility verdicts and input validation, one place for what `check`, `run`, the page
and the API refuse. Imports from models and core."""
