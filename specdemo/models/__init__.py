"""Models: loading targets and drafters by spec (hub id, folder, GGUF, built-in), quantisation,
the CPU fast path and the machine's hardware facts. Imports only from core."""
