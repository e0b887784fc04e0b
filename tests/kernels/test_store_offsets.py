"""The epilogue store's offsets by stride arithmetic (issue 33): where a chain's
result goes through reshapes and transposes, with ``O(R + N)`` memory, never a
table of one int64 per element (4.5 GiB for a 1.1 GiB f32 tensor)."""
import math
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api.kernels import store
from graph_api.kernels.fused.chain import _store_offsets
from graph_api.kernels.plan import CompileRequest
from graph_api.kernels.registry import select_plan
from graph_api.logical_tensor import dense_strides

RNG = np.random.default_rng(33)


def random_layout(rng, rank):
    """A shape and non-overlapping strides (a permuted dense layout, some dims stepped by 2)."""
    shape = tuple(int(d) for d in rng.choice([1, 2, 3, 4], size=rank))
    order = rng.permutation(rank)
    strides, acc = [0] * rank, 1
    for axis in reversed(order):
        strides[axis], acc = acc, acc * shape[axis] * int(rng.choice([1, 2]))
    return shape, tuple(strides)


def offsets_view(shape, strides):
    """numpy's view of the offsets: ``arange`` seen through the strides."""
    span = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
    base = np.arange(span, dtype=np.int64)
    return as_strided(base, shape, tuple(s * 8 for s in strides))


@pytest.mark.parametrize("seed", range(40))
def test_reshape_strides_is_numpys_no_copy_reshape(seed):
    rng = np.random.default_rng(seed)
    shape, strides = random_layout(rng, int(rng.integers(1, 5)))
    n = math.prod(shape)
    factors = [d for d in range(1, n + 1) if n % d == 0]
    new_shape = (int(rng.choice(factors)),)
    new_shape = new_shape + (n // new_shape[0],)
    if rng.random() < 0.5:
        new_shape = (1,) + new_shape[:1] + (1,) + new_shape[1:]
    view = offsets_view(shape, strides)
    try:
        want = np.reshape(view, new_shape, copy=False)
    except ValueError:
        want = None
    got = store.reshape_strides(shape, strides, new_shape)
    if want is None:
        assert got is None
    else:
        assert got is not None
        np.testing.assert_array_equal(offsets_view(new_shape, got) if n else want, want)


def table_offsets(layout, lts, shape, strides, R, N):
    """The former way: the whole table, transposed and reshaped, then split."""
    off = np.zeros(shape, np.int64)
    for axis, (d, s) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[axis] = d
        off = off + (np.arange(d, dtype=np.int64) * s).reshape(view)
    for op in reversed(layout):
        if op.kind == K.StaticTranspose:
            off = off.transpose(np.argsort([o % off.ndim for o in op.attrs["order"]]))
        else:
            off = off.reshape(lts[op.inputs[0].id].shape)
    return store.separable(off.reshape(R, N))


def fake_op(kind, in_id, **attrs):
    return SimpleNamespace(kind=kind, attrs=attrs, inputs=[SimpleNamespace(id=in_id)])


@pytest.mark.parametrize("seed", range(60))
def test_store_offsets_equal_the_table_through_reshapes_and_transposes(seed):
    rng = np.random.default_rng(1000 + seed)
    dest_shape, dest_strides = random_layout(rng, int(rng.integers(1, 5)))
    # walk back from the destination: a few transposes and reshapes to the head's shape
    layout, lts, shape = [], {}, dest_shape
    for step in range(int(rng.integers(0, 4))):
        tid = 100 + step
        if rng.random() < 0.5 and len(shape) > 1:
            order = [int(o) for o in rng.permutation(len(shape))]
            before = tuple(shape[order.index(i)] for i in range(len(shape)))  # transpose(before, order) = shape
            layout.insert(0, fake_op(K.StaticTranspose, tid, order=order))
            shape = before
        else:
            n = math.prod(shape)
            first = int(rng.choice([d for d in range(1, n + 1) if n % d == 0]))
            shape = (first, n // first)
            layout.insert(0, fake_op(K.StaticReshape, tid))
        lts[tid] = SimpleNamespace(shape=shape)
    N = shape[-1]
    R = math.prod(shape) // N
    want = table_offsets(layout, lts, dest_shape, dest_strides, R, N)
    got = _store_offsets(store, layout, lts, dest_shape, dest_strides, R, N)
    if want is None:
        assert got is None
    else:
        assert got is not None
        np.testing.assert_array_equal(got[0][:, None] + got[1][None, :], want[0][:, None] + want[1][None, :])


def test_a_chain_plan_for_a_large_output_takes_no_offset_per_element():
    """MatMul -> ReLU into a [2^18, 256] f32 (256 MiB) column-major output: the
    plan's offsets are 2^18 + 256 int64, not 2^26 (512 MiB and its temporaries)."""
    shape, k = (1 << 18, 256), 16
    g = ga.Graph()
    g.add_op(ga.Op(0, K.MatMul, [ga.LogicalTensor(0, dt.f32, (shape[0], k)), ga.LogicalTensor(1, dt.f32, (k, shape[1]))],
                   [ga.LogicalTensor(2, dt.f32, shape)]))
    g.add_op(ga.Op(1, K.ReLU, [ga.LogicalTensor(2, dt.f32, shape)],
                   [ga.LogicalTensor(3, dt.f32, shape, (1, shape[0]))]))
    g.finalize()
    (part,) = g.get_partitions()
    lts = {t: lt if lt.strides is not None else lt.with_shape(lt.shape, dense_strides(lt.shape), lt.layout)
           for t, lt in g.tensors.items()}
    request = CompileRequest(part.pattern_name, part.ops, lts, [0, 1], [3], g.fpmath, {})
    tracemalloc.start()
    try:
        plan = select_plan(request)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.name != "reference" and plan.offsets is not None
    roff, coff = plan.offsets
    assert roff.shape == (shape[0],) and coff.shape == (shape[1],)
    assert roff[5] == 5 and coff[3] == 3 * shape[0]  # column-major: rows step 1, columns 2^18
    assert peak < 32 << 20, f"plan construction peaked at {peak:,} bytes"
