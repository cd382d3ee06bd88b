"""The widths of a transformers decoder as its config states them, read in one place: the
forwards of our own (native, int8, cuda-graphs), the cache sizes and the drafters' configs built
from a target's all read them here."""

from __future__ import annotations


class ModelShape:
    """A decoder's widths, read from a transformers config (``config.get_text_config()`` for a
    multimodal one). A backend's model class inherits it and calls ``ModelShape.__init__``.

    Attributes:
        n_layer: decoder layers (``num_hidden_layers``).
        hidden: the residual width (``hidden_size``).
        n_head: query heads (``num_attention_heads``).
        n_kv: key/value heads (``num_key_value_heads``, else ``n_head``).
        head_dim: width of one head (``head_dim``, else ``hidden // n_head``).
        inter: the MLP's inner width (``intermediate_size``), None when the config has none.
        eps: the RMSNorm epsilon (``rms_norm_eps``), None when the config has none.
    Raises:
        AttributeError: the config has no ``num_hidden_layers``, ``hidden_size`` or
            ``num_attention_heads``.
    """

    def __init__(self, cfg) -> None:
        self.n_layer = cfg.num_hidden_layers
        self.hidden = cfg.hidden_size
        self.n_head = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_head
        self.head_dim = getattr(cfg, "head_dim", None) or self.hidden // self.n_head
        self.inter = getattr(cfg, "intermediate_size", None)
        eps = getattr(cfg, "rms_norm_eps", None)
        self.eps = None if eps is None else float(eps)

    def kv_bytes(self, length: int, element_size: int) -> int:
        """Bytes of the keys and values of ``length`` cached positions, ``element_size`` bytes
        a number (4: float32, 2: float16 or bfloat16)."""
        return 2 * element_size * self.n_layer * self.n_kv * self.head_dim * length
