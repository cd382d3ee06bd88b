"""Core: the decode loop, KV cache and rollback, sampling and verification, statistics,
draft-length policies, the drafter protocol and the drafter families. Imports no other layer."""
