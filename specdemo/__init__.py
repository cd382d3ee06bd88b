"""specdemo: race plain autoregressive decoding against speculative decoding, with honest numbers."""

__version__ = "0.1.0"
