"""EAGLE-3: a one-layer draft head over fused target features (Li et al. 2025, "EAGLE-3: Scaling
up Inference Acceleration of Large Language Models via Training-Time Test", arXiv:2503.01840).

Per draft position t the head reads the target's features at t (the inputs of three target
layers, concatenated: (3 * Ht,)) and the embedding of the token at t + 1, and predicts the token at
t + 2::

    h0 = fc(features)                                      # (H,), only for real target features
    x  = concat(input_layernorm(embed(token)), hidden_norm(h))      # (2H,)
    h  = h + attn(x);  h = h + mlp(post_attention_layernorm(h))      # one Llama-style layer
    logits = lm_head(norm(h))                              # (Vd,), draft vocabulary
    target_id = draft_id + d2t[draft_id]

Each further draft step feeds the layer's output ``h`` back in place of ``fc(features)``. Weight
names follow vLLM's speculators layout (``fc``, ``layers.0.*``, ``norm``, ``lm_head``, ``d2t``,
``t2d``); the module after speculators ``Eagle3DraftModel`` / ``LlamaDecoderEagle3FirstLayer``.
The attention is written out here (not transformers' kernels) because training-time test needs
its own mask: see :func:`ttt_attention`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from ..sampling import SamplingParams
from ..shape import ModelShape
from ..tree import DraftTree, TreeShape
from .base import DraftSampler, Proposal, param_bytes
from .vocab import target_ids


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (B, heads, T, d) with (B, T, d) cos/sin (transformers' rotate_half layout)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Eagle3Layer(nn.Module):
    """The head's decoder layer: attention over (2H,) inputs, then a gated MLP with the config's
    ``hidden_act`` (SwiGLU for silu), as transformers' ``LlamaMLP``."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False) -> None:
        super().__init__()
        shape = ModelShape(config)
        h, nh, kvh = shape.hidden, shape.n_head, shape.n_kv
        self.head_dim, self.heads, self.kv_heads = shape.head_dim, nh, kvh
        self.norm_before_residual = norm_before_residual
        eps, bias = config.rms_norm_eps, bool(getattr(config, "attention_bias", False))
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * h, nh * self.head_dim, bias=bias)
        self.self_attn.k_proj = nn.Linear(2 * h, kvh * self.head_dim, bias=bias)
        self.self_attn.v_proj = nn.Linear(2 * h, kvh * self.head_dim, bias=bias)
        self.self_attn.o_proj = nn.Linear(nh * self.head_dim, h, bias=bias)
        mlp_bias = bool(getattr(config, "mlp_bias", False))
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, config.intermediate_size, bias=mlp_bias)
        self.mlp.up_proj = nn.Linear(h, config.intermediate_size, bias=mlp_bias)
        self.mlp.down_proj = nn.Linear(config.intermediate_size, h, bias=mlp_bias)
        self.act = ACT2FN[getattr(config, "hidden_act", "silu")]  # not a module with weights

    def qkv(self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """(B, T, H) token embeddings and hidden inputs -> q (B, nh, T, d), k, v (B, kvh, T, d),
        and the residual (B, T, H)."""
        b, t, _ = hidden.shape
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # (B, T, 2H)
        attn = self.self_attn
        q = attn.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return rotate(q, cos, sin), rotate(k, cos, sin), v, residual

    def finish(self, attended: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """(B, nh, T, d) attention output + residual -> (B, T, H) layer output."""
        b, _, t, _ = attended.shape
        h = residual + self.self_attn.o_proj(attended.transpose(1, 2).reshape(b, t, -1))
        mlp = self.mlp
        x = self.post_attention_layernorm(h)
        return h + mlp.down_proj(self.act(mlp.gate_proj(x)) * mlp.up_proj(x))

    def expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(B, kvh, S, d) -> (B, nh, S, d) for grouped-query attention."""
        return x.repeat_interleave(self.heads // self.kv_heads, dim=1)


def ttt_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor,
                  ks: list[torch.Tensor], vs: list[torch.Tensor]) -> torch.Tensor:
    """Attention of training-time-test step j = len(ks) (EAGLE-3, section 3.3).

    A step-j query at anchor t plays draft step j after the real position t: it sees the real
    (step-0) keys at positions <= t and its own chain's keys of steps 1..j at the same anchor t,
    exactly what it sees at inference.

    Args:
        q: (B, h, T, d) queries of step j; k0, v0: (B, h, T, d) step-0 keys/values;
        ks, vs: j tensors (B, h, T, d), the keys/values of steps 1..j.
    Returns:
        (B, h, T, d).
    """
    scale = q.shape[-1] ** -0.5
    t = q.shape[2]
    main = (q @ k0.transpose(-1, -2)) * scale  # (B, h, T, T)
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    main = main.masked_fill(~causal, float("-inf"))
    diag = [((q * k).sum(-1) * scale).unsqueeze(-1) for k in ks]  # j x (B, h, T, 1)
    weights = torch.cat([main, *diag], dim=-1).softmax(dim=-1)
    out = weights[..., :t] @ v0
    for i, v in enumerate(vs):
        out = out + weights[..., t + i:t + i + 1] * v
    return out


class Eagle3Head(nn.Module):
    """The EAGLE-3 draft head (module docstring).

    Args:
        config: the decoder layer's LlamaConfig (hidden_size H, heads, intermediate_size,
            rms_norm_eps, rope settings, vocab_size = the target's V).
        draft_vocab_size: Vd, width of ``lm_head``.
        feature_layers: ``hidden_states`` indices of the target it reads (inputs of layers).
        target_hidden_size: Ht, the target's hidden size (default H).
        norm_before_residual: speculators' option of that name.
        norm_before_fc: one RMSNorm (``input_norm``) over the concatenated features before ``fc``
            (speculators ``norm_before_fc``, vLLM's gpt-oss heads).
        fc_norm: one RMSNorm per feature layer (``fc_norm.i``) before concatenation (speculators
            ``fc_norm``); exclusive with ``norm_before_fc``.
        norm_output: feed the *normed* output back to the next draft step (speculators
            ``norm_output``, "EAGLE 3.1").
        verifier: {"name_or_path", "architectures"} of the target it was trained for.
        own_embeddings: keep an embedding table of its own; else the target's is attached
            (:meth:`attach`), as vLLM does when a checkpoint has no ``embed_tokens``.
    """

    def __init__(self, config: LlamaConfig, draft_vocab_size: int, feature_layers: tuple[int, ...],
                 target_hidden_size: int | None = None, norm_before_residual: bool = False,
                 verifier: dict | None = None, own_embeddings: bool = False,
                 norm_before_fc: bool = False, fc_norm: bool = False,
                 norm_output: bool = False) -> None:
        super().__init__()
        if norm_before_fc and fc_norm:
            raise ValueError("norm_before_fc and fc_norm are exclusive (speculators refuses both)")
        self.config = config
        self.draft_vocab_size = draft_vocab_size
        self.feature_layers = tuple(int(i) for i in feature_layers)
        self.target_hidden_size = target_hidden_size or config.hidden_size
        self.norm_before_residual = norm_before_residual
        self.verifier = dict(verifier or {})
        h = config.hidden_size
        self.norm_output = norm_output
        n, ht, eps = len(self.feature_layers), self.target_hidden_size, config.rms_norm_eps
        self.input_norm = LlamaRMSNorm(n * ht, eps=eps) if norm_before_fc else None
        self.fc_norm = (nn.ModuleList([LlamaRMSNorm(ht, eps=eps) for _ in range(n)]) if fc_norm
                        else None)
        self.fc = nn.Linear(n * ht, h, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(config, norm_before_residual)])
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, h) if own_embeddings else None
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        self._target_embed: tuple[nn.Module, ...] = ()  # a tuple: not registered, not saved

    def attach(self, embeddings: nn.Module) -> None:
        """Use the target's input embeddings (not copied, not saved, not counted as its memory)."""
        self._target_embed = (embeddings,)

    def embedding_table(self) -> nn.Module | None:
        """The head's own embeddings, else the attached target's, else None."""
        return self.embed_tokens if self.embed_tokens is not None else (
            self._target_embed or [None])[0]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) target ids -> (B, T, H) embeddings.

        Raises:
            RuntimeError: the head has no embeddings of its own and none were attached.
        """
        table = self.embedding_table()
        if table is None:
            raise RuntimeError("the EAGLE-3 head needs the target's embeddings: call attach()")
        return table(ids).to(self.fc.weight.dtype)

    def rope(self, hidden: torch.Tensor, positions: torch.Tensor):
        """cos, sin (B, T, d) for (B, T) positions."""
        return self.rotary_emb(hidden, positions)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """(..., n * Ht) concatenated target features -> (..., H) the first step's hidden input:
        ``fc`` after the optional ``input_norm`` / per-layer ``fc_norm`` (speculators
        ``Eagle3DraftModel.forward``)."""
        x = features.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.fc_norm is not None:
            chunks = x.chunk(len(self.fc_norm), dim=-1)  # one (..., Ht) per feature layer
            x = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(x)

    def draft_ids(self) -> torch.Tensor:
        """(Vd,) the target id of every draft id."""
        return target_ids(self.d2t)

    def step(self, hidden: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor,
             past: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor | None = None):
        """One inference pass over T new draft positions with a KV cache.

        Args:
            hidden: (1, T, H) inputs (``fc(features)`` for real positions, or the previous
                output for a draft step).
            ids: (1, T) the target ids of the tokens after those positions.
            positions: (1, T) positions (continuing the cache's).
            past: cached (k, v), each (1, kvh, S, d), or None.
            mask: (T, S + T) bool, True where a position may attend (a draft tree's); None:
                causal.
        Returns:
            (output (1, T, H), logits (1, T, Vd), (k, v) with S + T positions); the output is
            the one the next draft step reads (normed when ``norm_output``).
        """
        layer = self.layers[0]
        cos, sin = self.rope(hidden, positions)
        q, k, v, residual = layer.qkv(self.embed(ids), hidden, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        t, s = q.shape[2], k.shape[2]
        if mask is None:
            mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)
        attended = F.scaled_dot_product_attention(q, layer.expand_kv(k), layer.expand_kv(v),
                                                  attn_mask=mask)
        out = layer.finish(attended, residual)
        normed = self.norm(out)
        return (normed if self.norm_output else out), self.lm_head(normed), (k, v)

    def ttt_forward(self, features: torch.Tensor, ids: torch.Tensor, steps: int,
                    logits: bool = True) -> list[torch.Tensor]:
        """Training-time test: ``steps`` unrolled draft steps over whole sequences.

        Step 0 reads real features; step j > 0 reads step j-1's outputs and the tokens one
        further on (the target's own tokens: drafting continues only while they were accepted).

        Args:
            features: (B, T, 3 * Ht) target features at positions 0..T-1.
            ids: (B, T + steps) token ids; pair t of step j takes ids[:, t + 1 + j].
            steps: unrolled steps (>= 1).
            logits: False returns each step's normed hidden state (B, T, H) instead, so that
                training applies ``lm_head`` only where the loss is taken.
        Returns:
            ``steps`` tensors (B, T, Vd) of draft logits (or (B, T, H), see ``logits``); step j
            at anchor t predicts the token at t + 2 + j.
        """
        b, t, _ = features.shape
        layer = self.layers[0]
        hidden = self.project(features)
        positions = torch.arange(t, device=features.device).expand(b, t)
        out_logits, ks, vs, k0 = [], [], [], None
        for j in range(steps):
            cos, sin = self.rope(hidden, positions + j)
            q, k, v, residual = layer.qkv(self.embed(ids[:, 1 + j:1 + j + t]), hidden, cos, sin)
            k, v = layer.expand_kv(k), layer.expand_kv(v)
            if j == 0:
                k0, v0 = k, v
                attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                ks.append(k)
                vs.append(v)
                attended = ttt_attention(q, k0, v0, ks, vs)
            hidden = layer.finish(attended, residual)
            normed = self.norm(hidden)
            if self.norm_output:
                hidden = normed
            out_logits.append(self.lm_head(normed) if logits else normed)
        return out_logits


class Eagle3Drafter:
    """Drafting with an :class:`Eagle3Head` inside the engine (a FeatureDrafter).

    The head keeps a KV cache over the real (target-feature) positions; draft steps are appended
    for one round and cropped before the next, so a rejection needs no other rollback. Proposals
    carry the distributions they were drawn from (the target's sampling parameters applied to
    the head's logits), so speculative sampling keeps the target's distribution; greedy drafts
    are one-hot.

    Args:
        head: the loaded head (embeddings attached or its own).
        vocab_size: V, the target's logits width.
        name: shown in stats and the UI.
        stepper: an object computing ``head.step`` with its own KV cache (default None: the
            torch head and a torch cache); see :meth:`use_stepper`.
    """

    def __init__(self, head: Eagle3Head, vocab_size: int, name: str = "eagle3",
                 stepper=None) -> None:
        self.head = head
        self.name = name
        self.vocab_size = vocab_size
        self.feature_layers = head.feature_layers
        self._ids = head.draft_ids()
        self._ids_increasing = bool((self._ids[1:] > self._ids[:-1]).all())
        self._ids_host = self._ids.tolist()
        self._pending: list[torch.Tensor] = []  # observed features not yet fed to the head
        self._n_real = 0  # real positions in the cache
        self._past: tuple[torch.Tensor, torch.Tensor] | None = None
        self._last_out: torch.Tensor | None = None  # (1, 1, H) output at the last real position
        self._primed: torch.Tensor | None = None  # (Vd,) logits of prime(), for the next draft
        self._weight_bytes = param_bytes(head)  # attached target embeddings are not the head's
        self.stepper = None
        if stepper is not None:
            self.use_stepper(stepper)

    def use_stepper(self, stepper) -> None:
        """Compute the head's steps with ``stepper`` instead of torch (before the first round).

        ``stepper`` (duck-typed; e.g. ``models.native.NativeEagleHead``) has
        ``step(hidden (T, H), ids: list[int], start: int, keep: int) -> (out (T, H), logits
        (keep, Vd))`` with the semantics of :meth:`Eagle3Head.step` over positions
        start..start+T-1 and a cache of its own, ``rollback(length)`` and ``cache_bytes``.

        Raises:
            RuntimeError: the drafter has drafted already (its torch cache would be lost).
        """
        if self._n_real or self._past is not None:
            raise RuntimeError("EAGLE-3 drafter: a stepper must be set before the first round")
        self.stepper = stepper

    def observe(self, features: torch.Tensor) -> None:
        self._pending.append(features)
        self._primed = None

    @torch.inference_mode()
    def prime(self, context: list[int]) -> None:
        """Feed the observed features now (the prompt's, after the prefill and the first new
        token: ``base.Primes``); the next draft starts from the logits this gives unless other
        features are observed first. Without pending features nothing happens.

        Raises:
            RuntimeError: the features do not match ``context`` (as :meth:`propose`).
        """
        if self._pending:
            self._primed = self._catch_up(context)

    def _first_logits(self, context: list[int]) -> torch.Tensor:
        """(Vd,) logits at the last real position: fed from the pending features, or primed."""
        if self._pending:
            return self._catch_up(context)
        if self._primed is not None:
            logits, self._primed = self._primed, None
            return logits
        raise RuntimeError("EAGLE-3 drafter: no new target features since the last round")

    @torch.inference_mode()
    def _catch_up(self, context: list[int]) -> torch.Tensor:
        """Feed the observed features (pairs (f_i, context[i + 1])); logits (Vd,) at the last."""
        if self._past is not None:  # drop last round's draft steps
            self._past = (self._past[0][:, :, :self._n_real], self._past[1][:, :, :self._n_real])
        feats = torch.cat(self._pending).unsqueeze(0)  # (1, n, F)
        self._pending.clear()
        n = feats.shape[1]
        start = self._n_real
        if start + n != len(context) - 1:
            raise RuntimeError(f"EAGLE-3 drafter out of step: features for {start + n} positions, "
                               f"context has {len(context)} tokens")
        if self.stepper is not None:
            self.stepper.rollback(start)  # drop last round's draft steps
            out, logits = self.stepper.step(self.head.project(feats)[0],
                                            list(context[start + 1:start + n + 1]), start, 1)
            self._n_real = start + n
            self._last_out = out[-1:]
            return logits[-1]
        ids = torch.tensor([context[start + 1:start + n + 1]], device=feats.device)
        positions = torch.arange(start, start + n, device=feats.device).unsqueeze(0)
        out, logits, self._past = self.head.step(self.head.project(feats), ids, positions,
                                                 self._past)
        self._n_real = start + n
        self._last_out = out[:, -1:]
        return logits[0, -1]

    stops_early = True  # propose takes keep_going (engine.decode, policy.more)
    drafts_trees = True  # propose_tree (base.TreeDrafter)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None, keep_going=None) -> Proposal:
        """Up to k tokens, one head step each.

        Args:
            keep_going: None, or ``keep_going(confidence: list[float]) -> bool`` asked after
                each token but the k-th with the confidences so far (``Proposal.confidence``);
                drafting stops when it says False (one device-to-host transfer a token).
        Raises:
            RuntimeError: no target features were observed since the last round.
        """
        if k <= 0:
            return Proposal([], source=self.name)
        logits = self._first_logits(context)  # the engine observes after every target forward
        sampler = DraftSampler(context, params, generator)
        hidden, past = self._last_out, self._past
        position = self._n_real
        said: list[float] = []  # the confidences so far, on the host, for keep_going
        for step in range(k):
            token = sampler.draw_subset(logits, self._ids, self.vocab_size,
                                       self._ids_increasing, self._ids_host)
            if step + 1 == k:
                break
            if keep_going is not None:
                said.append(sampler.last_confidence())
                if not keep_going(said):
                    break
            if self.stepper is not None:
                hidden, out_logits = self.stepper.step(hidden, [sampler.last_id()], position, 1)
                logits = out_logits[-1]
                position += 1
                continue
            pos = torch.tensor([[position]], device=hidden.device)
            hidden, out_logits, past = self.head.step(hidden, token.view(1, 1), pos, past)
            logits = out_logits[0, -1]
            position += 1
        self._past = past
        return sampler.proposal(self.name)

    @torch.inference_mode()
    def propose_tree(self, context: list[int], shape: TreeShape) -> DraftTree:
        """A greedy draft tree of ``shape`` (``core.tree``): at each node, the head's tokens of
        the ranks the shape asks for, each continued on its own branch. The nodes of one depth
        are stepped in one head call with tree attention (each sees the real positions and its
        own ancestors), so a tree of depth d costs d head calls, as a chain of d tokens.

        Raises:
            RuntimeError: no target features were observed since the last round.
        """
        logits = self._first_logits(context)  # (Vd,) at the last real position
        paths, parents = shape.paths, shape.parents()
        ids: list[int] = [0] * len(paths)
        by_depth: dict[int, list[int]] = {}
        for i, p in enumerate(paths):
            by_depth.setdefault(len(p), []).append(i)
        has_children = {parents[i] for i in range(len(paths))}
        # the logits each expanded node (and the root, -1) gives its children
        node_logits: dict[int, torch.Tensor] = {-1: logits}
        node_out: dict[int, torch.Tensor] = {-1: self._last_out.reshape(1, -1)}
        row_of: dict[int, int] = {}  # node -> its row in the head's draft rows (from n_real)
        hidden_past = self._past
        for depth in range(1, shape.depth + 1):
            nodes = by_depth.get(depth, [])
            # choose each node's token from its parent's logits
            wanted: dict[int, list[int]] = {}
            for i in nodes:
                wanted.setdefault(parents[i], []).append(i)
            for parent, kids in wanted.items():
                top = max(paths[i][-1] for i in kids) + 1
                order = node_logits[parent].float().topk(min(top, node_logits[parent].numel())).indices
                order = self._ids[order].tolist()
                for i in kids:
                    r = paths[i][-1]
                    ids[i] = order[r] if r < len(order) else order[-1]
            expand = [i for i in nodes if i in has_children]
            if not expand:
                continue
            first_row = len(row_of)
            for j, i in enumerate(expand):
                row_of[i] = first_row + j
            hidden = torch.cat([node_out[parents[i]] for i in expand])  # (T, H)
            position = self._n_real + depth - 1
            n_rows = first_row + len(expand)
            anc = []
            for i in expand:  # rows of its expanded ancestors and itself
                bits, a = 0, i
                while a >= 0:
                    if a in row_of:
                        bits |= 1 << row_of[a]
                    a = parents[a]
                anc.append(bits)
            if self.stepper is not None:
                out, lg = self.stepper.step(hidden, [ids[i] for i in expand],
                                            self._n_real + first_row, len(expand),
                                            tree=([position] * len(expand), anc, self._n_real))
            else:
                t = len(expand)
                mask = torch.zeros(t, self._n_real + n_rows, dtype=torch.bool)
                mask[:, :self._n_real] = True
                for j, bits in enumerate(anc):
                    for r in range(n_rows):
                        if (bits >> r) & 1:
                            mask[j, self._n_real + r] = True
                dev = hidden.device
                out3, lg3, hidden_past = self.head.step(
                    hidden.unsqueeze(0), torch.tensor([[ids[i] for i in expand]], device=dev),
                    torch.full((1, t), position, device=dev), hidden_past, mask.to(dev))
                out, lg = out3[0], lg3[0]
            for j, i in enumerate(expand):
                node_out[i] = out[j:j + 1]
                node_logits[i] = lg[j]
        self._past = hidden_past
        return DraftTree(ids, parents, source=self.name)

    def feedback(self, n_accepted: int) -> None:
        pass

    @property
    def extra_memory_bytes(self) -> int:
        cache = sum(t.numel() * t.element_size() for t in self._past) if self._past else 0
        if self.stepper is not None:
            cache = self.stepper.cache_bytes
        return self._weight_bytes + cache
