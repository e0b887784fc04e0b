"""Scaled dot-product attention with plain or int4/int8-compressed K/V.

Formula, per batch ``b``, query head ``h`` (KV head ``h // rep``), query row ``i``::

    s[j]   = (q[i] . k[j]) * scale  (or / scale)  + mask[b, h, i, j]   (-inf if causal hides j)
    out[i] = sum_j softmax(s)[j] * v[j]

with ``k[j, d] = (K[.., j, d] - zk) * sk`` dequantized tile by tile (groups of
``G`` along the head dimension ``D``) and the same for ``v``.  The tiled kernels
make no f32 copy of K or V: each work item dequantizes a tile of ``T = 128``
positions into an L2-resident f32 buffer, scores it for all the query rows that
share the KV head (GQA/MQA: the K/V tile is read once for ``rep * Sq`` rows), and
updates an online softmax (running max ``m``, sum ``l`` and f32 accumulator).
A prefill (at least 32 query rows) without fpmath rounding makes one instead: K
and V widened to f32 once per call (:func:`attention._widened_prefill`, in bounded chunks),
then the f32 prefill kernel (:mod:`graph_api.kernels.sdpa.prefill`); the tiled
kernel would dequantize each tile again for every tile of query rows.

Decode (few query rows): the KV length is split over work items
("flash-decoding"), so both threads are busy at batch 1 with one KV head; the
partial ``(m, l, acc)`` are merged in a fixed order (log-sum-exp, numpy).
Prefill: work items are (batch, KV head, query tile of 32 positions); causal
tiles beyond the diagonal are skipped.  int4/int8 decode with K stored
``[D, S]`` runs :func:`decode.decode_items`, which folds the scales into the products
instead of dequantizing tiles (see the section "compressed decode"); on AVX2 it
stages each K/V chunk as 8-bit integers first (:func:`decode_avx2._stage4`).  Measured (Zen 3,
AVX2, Hq=32 Hkv=8 L=4096 s4): ~8.8 us per 128 positions and KV head on one core,
~30-40% of the FMA bound of strict f32, which alone caps the decode at ~60-70% of
the machine's cold read bandwidth.

Threads: each kernel is one ``nogil`` function over a list of work items, run
on ``numba.get_num_threads()`` Python threads of :mod:`graph_api.kernels.threads`
(items dealt round-robin; the compressed decode's threads claim items one at a
time, :func:`threads.run_claimed`).  A ``prange`` wrapper would re-optimise
everything it links and cost about as much compile time again on an empty cache.

Arithmetic is f32 with explicit FMAs in a fixed order (no fastmath flags); the
exponential is :func:`graph_api.kernels.bits.exp32` (<= 2 ulp, vectorised).  fpmath
rounding (``rnd``) applies to f32 Q and to f32/dequantized K and V when asked.
Under fpmath bf16 with ``apply_to_int`` (``bf16_dot``) the int4/int8 decode runs
:mod:`graph_api.kernels.sdpa.decode_bf16` instead: Q.K and P.V on ``vdpbf16ps``.

Layouts: Q ``[B, Hq, Sq, D]``; K ``[B, Hkv, S, D]`` ("bhsd", scales
``[B, Hkv, S, D/G]``) or transposed ``[B, Hkv, D, S]`` ("bhds", scales
``[B, Hkv, D/G, S]``); V ``[B, Hkv, S, D]``.  Fastest: K transposed ("bhds":
the tile load is vectorised over positions; int4 needs even S) and V "bhsd"
(vectorised over d; int4 needs even D and G).  K "bhsd" is transposed into
the tile while converting (scalar stores); odd int4 shapes use per-element
indexing.

Modules, one per concern:

* :mod:`.attention`: the entry, :func:`sdpa` (picks the kernel, runs its work items,
  merges) and :func:`prefill_runner`; K/V widened for the f32 prefill in chunks.
* :mod:`.operands`: the operand bundle :class:`KV`, storage kinds, causal modes, the
  flat argument forms the kernels take.
* :mod:`.tiled`: tile loaders (dequantize ``T`` positions to f32) and the tiled kernel.
* :mod:`.blocked`: the register-blocked kernel (head size a multiple of 16).
* :mod:`.online_softmax`: the online-softmax step every kernel shares.
* :mod:`.widen`: K/V/Q widened to f32 (exact conversion, the kernels' dequantization).
* :mod:`.merge`: the numpy merge of split partials, row stats, the output store.
* :mod:`.prefill`: the f32 prefill kernel (up to 4096 keys; the quantized form's
  exact probability quantize).
* :mod:`.decode`: the int4/int8 compressed decode's work item; its steps in
  :mod:`.decode_avx512` (stored bytes, nibble lookups) and :mod:`.decode_avx2`
  (staged 8-bit tiles, one vector per pass); :mod:`.decode_bf16` the same decode
  under fpmath bf16 on ``vdpbf16ps``.
* :mod:`.backward`: the training backward (per-head query blocks, OpenBLAS GEMMs).
"""
from graph_api.kernels.sdpa.attention import prefill_runner, sdpa
from graph_api.kernels.sdpa.operands import CAUSAL, KINDS, KV

__all__ = ["CAUSAL", "KINDS", "KV", "prefill_runner", "sdpa"]
