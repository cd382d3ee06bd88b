"""Packing a transformers model's weights into the layouts the C forward reads: BF16 blocks,
int8 rows with a scale each, and the int8 layout of the ``w8a8`` kernel (:func:`repack_q8`)."""

from __future__ import annotations

import logging

import torch

from ...core import family_backends
from ..compiled_backend import quantize_rows

log = logging.getLogger(__name__)


NAME = "native"

#: the native backends (``core.TARGET_BACKENDS``): name -> weight format of the C forward
_WEIGHTS = family_backends("native")


COLUMNS = 32  # columns per chunk of a block


def _row_blocks(w: torch.Tensor, rows: int) -> torch.Tensor:
    """(M, K) -> (ceil(M / rows), rows, K // COLUMNS, COLUMNS), M padded with zero rows.

    Raises:
        ValueError: K not a multiple of COLUMNS."""
    m, k = w.shape
    if k % COLUMNS:
        raise ValueError(f"a weight of {k} columns; the native kernels need a multiple of {COLUMNS}")
    pad = -m % rows
    if pad:
        w = torch.cat([w, w.new_zeros(pad, k)])
    return w.view(-1, rows, k // COLUMNS, COLUMNS)


def repack(w: torch.Tensor, rows: int) -> torch.Tensor:
    """A (M, K) weight in the C kernels' layout: rows in blocks of ``rows`` (native_forward.c's
    RB, ``nf_rows()``; M padded with zero rows to a multiple), each block stored chunk by chunk
    of :data:`COLUMNS` columns, the rows of the block one after another within a chunk, so a
    block is one contiguous stream.

    Returns:
        (ceil(M / ROWS) * ROWS * K,) tensor of w's dtype.
    Raises:
        ValueError: K not a multiple of COLUMNS."""
    return _row_blocks(w, rows).permute(0, 2, 1, 3).contiguous().view(-1)


def repack_q8(q: torch.Tensor, rows: int) -> torch.Tensor:
    """A (M, K) int8 weight in the layout of native_forward.c's integer kernel (block_q8, for
    int8 activations): rows in blocks of ``rows`` (RBQ, ``nf_rows_q8()``; M padded with zero rows
    to a multiple), each block stored :data:`COLUMNS` columns at a time as 8 groups of 4 columns,
    a group holding the block's rows' 4 bytes one row after another (so a vector lane is a row).

    Returns:
        (ceil(M / rows) * rows * K,) int8.
    Raises:
        ValueError: K not a multiple of COLUMNS."""
    blocks = _row_blocks(q, rows)
    groups = blocks.reshape(*blocks.shape[:3], COLUMNS // 4, 4).permute(0, 2, 3, 1, 4)
    return groups.contiguous().view(-1)


def _int8(rows: int, *weights: torch.Tensor, layout=repack) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights stacked by rows as int8 with one scale per row (absmax / 127, round to
    nearest; w ~= q * scale), in ``layout`` (:func:`repack` or :func:`repack_q8`) in blocks of
    ``rows``.

    Returns:
        (q: (ceil(M / rows) * rows * K,) int8, scale: (ceil(M / rows) * rows,) float32; padded
        rows 0)."""
    q, scale = quantize_rows(torch.cat([w.detach() for w in weights]))
    pad = -scale.numel() % rows
    scale = torch.cat([scale, scale.new_zeros(pad)]) if pad else scale
    return layout(q, rows), scale.contiguous()


def _bf16(rows: int, *weights: torch.Tensor) -> torch.Tensor:
    """The weights stacked by rows, rounded to BF16 (round to nearest even), :func:`repack`ed
    in blocks of ``rows``."""
    return repack(torch.cat([w.detach() for w in weights]).to(torch.bfloat16), rows)


def _check_weights(weights: str) -> str:
    """``weights`` when it is a weight format of :data:`_WEIGHTS`.

    Raises:
        ValueError: it is not."""
    if weights not in _WEIGHTS.values():
        raise ValueError(f"weights {weights!r}: use {', '.join(_WEIGHTS.values())}")
    return weights


def _packer(weights: str, lib, scales: list[torch.Tensor]):
    """A function of linear weights -> their stacked matrix in the C library ``lib``'s layout:
    :func:`_bf16` for ``bf16``, else :func:`_int8` (``w8a8``: in :func:`repack_q8`'s layout),
    whose row scales it appends to ``scales`` (in call order, as :func:`_set_scales` gives them
    to the C model)."""
    q8 = weights == "w8a8"
    rows = lib.nf_rows_q8() if q8 else lib.nf_rows()

    def pack(*ws: torch.Tensor) -> torch.Tensor:
        if weights == "bf16":
            return _bf16(rows, *ws)
        q, scale = _int8(rows, *ws, layout=repack_q8 if q8 else repack)
        scales.append(scale)
        return q
    return pack


def _set_scales(lib, handle, weights: str, scales: list[torch.Tensor], layers: int) -> None:
    """Tell the C model ``handle`` its int8 weights' row scales (``scales`` in :func:`_packer`'s
    order: qkv, o, gate_up, down a layer for ``layers`` layers, then the output head's) and, for
    ``w8a8``, to quantise activations too; nothing for ``bf16``."""
    if weights == "bf16":
        return
    for i in range(layers):
        lib.nf_set_scales(handle, i, *(t.data_ptr() for t in scales[4 * i:4 * i + 4]))
    lib.nf_set_scales(handle, -1, scales[-1].data_ptr(), None, None, None)
    if weights == "w8a8":
        lib.nf_quantize_activations(handle)
