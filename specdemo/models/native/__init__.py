"""The ``native`` target backend: our own C forward of a Llama-architecture target with BF16
weights (issue 18's third candidate, after the ggml and int8 backends).

Why: on a 2-core CPU the transformers path spends ~15 ms of a 34 ms one-token forward in ~2,000
small operator calls and reads 538 MB of float32 weights, while llama.cpp's quantised kernels
are compute-bound, so a k-token verification there costs 2-4x a step (docs/cpu-backends.md).
``native/native_forward.c`` computes a whole forward in one call: weights in BF16 (half the float32
bytes), each weight block loaded once per forward and multiplied with every token of the forward
while it sits in registers (so a verification over 5-8 tokens reads the weights once, as a
one-token step does), a static float32 KV cache, a small thread pool instead of an operator per
step. Every token's numbers are independent of the other tokens of its forward (see the C file's
header), so greedy speculative output equals plain greedy output on this backend bit for bit.

Kernels (``SPECDEMO_NATIVE_KERNEL``; :func:`default_kernel`):

* ``fma``: BF16 weights widened to float32, float32 activations and accumulation (any CPU the C
  compiler vectorises for: AVX2, AVX-512, NEON).


* ``dpbf16``: activations rounded to BF16 too, products accumulated in float32 by VDPBF16PS
  (AVX512-BF16 CPUs only: Zen 4+, Cooper Lake, Sapphire Rapids+): twice the products per
  instruction, what keeps a 8-token forward close to a 1-token one on a 2-core CPU.


The C file is compiled once per machine with the system C compiler (``cc``, or ``$CC``;
``-O3 -march=native``) into ``models.cache_dir()/native/``; without a compiler the backend says
so and ``auto`` leaves it out. The weights are the transformers model's (for the built-in GGUF
models: the dequantised Q4_1 values) rounded to BF16, so logits differ from the float32 reference
by that rounding; the transformers float32 path stays the reference for losslessness tests, and
speculative output on this backend is compared with plain output *of this backend*.

``native-int8`` (:data:`_WEIGHTS`) is the same forward over int8 weights with one float32 scale
per output row (absmax / 127, round to nearest: weight-only, as gpt-fast's int8 and
``compiled_backend``'s), widened to float32 in the ``fma`` kernel: half the bytes a token of
BF16, for CPUs where reading the weights is what a step waits for. Its logits differ from the
float32 reference by that rounding; greedy speculative output still equals plain output of the
same backend bit for bit.

``native-w8a8`` is ``native-int8``'s weights with the activations quantised too: each matrix's
input is rounded to int8 with one scale per 32 values a token (absmax / 127, llama.cpp's Q8_0
format for activations) and multiplied with the int8 weights in exact int32 sums of 32 products
(``nf_quantize_activations``; W8A8 as in SmoothQuant and LLM.int8()). Its weights are laid out
for that kernel (:func:`repack_q8`: a vector lane per output row), which sums 32 products with
AVX512-VNNI's ``vpdpbusd`` where the CPU has it, else with AVX2's u8 x s8 product with the
weights' signs moved onto the activations (llama.cpp's q8 dot products), else in portable C: the
same numbers on all three. No widening of the weights and 4-16x the multiplies per instruction of
the float32 ``fma`` kernel, for CPUs where a verification over 5-8 tokens is compute-bound
(docs/cpu-backends.md). Its logits differ from ``native-int8``'s by the activation rounding;
each token's numbers still do not depend on the other tokens of a forward, so greedy
speculative output equals plain output of the same backend bit for bit.

The package, by concern: :mod:`.build` (compiling and loading the C file, the kernel),
:mod:`.weights` (packing the weights for it), :mod:`.model` (``NativeModel``, ``NativeKV``,
``NativeBatch``), :mod:`.prefetch` (``native-w8a8``'s weight prefetch, measured), :mod:`.attach`
(the forward kept on a loaded target) and :mod:`.eagle` (an EAGLE-3 head's step in C).
"""

from __future__ import annotations

from .attach import _ATTR, model_of, native_model, unavailable_reason
from .build import (CFLAGS_ENV, KERNEL_ENV, KERNELS, NativeError, default_kernel, library,
                    library_path)


from .eagle import NativeEagleHead, NativeEagleWeights, head_stepper, head_unsupported_reason
from .model import ARCHITECTURES, NativeBatch, NativeKV, NativeModel, unsupported_reason
from .prefetch import PREFETCH_ENV, PREFETCH_FILE, choose_prefetch
from .weights import NAME, repack, repack_q8

__all__ = ["ARCHITECTURES", "CFLAGS_ENV", "KERNELS", "KERNEL_ENV", "NAME", "NativeBatch",
           "NativeEagleHead", "NativeEagleWeights", "NativeError", "NativeKV", "NativeModel",
           "PREFETCH_ENV", "PREFETCH_FILE", "choose_prefetch", "default_kernel", "head_stepper",
           "head_unsupported_reason", "library", "library_path", "model_of", "native_model",
           "repack", "repack_q8", "unavailable_reason", "unsupported_reason"]
