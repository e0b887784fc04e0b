"""The numpy reference kernels against independent formulas.

Every ``OP_CASES`` record runs through ``REFERENCE`` and is compared with its
``expected`` function under the record's tolerance; the targeted tests below
pin the behaviours a fast kernel is most likely to get wrong.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from graph_api import dtypes
from graph_api.dtypes import DataType
from graph_api.enums import OpKind
from graph_api.errors import Unimplemented
from graph_api.fpmath import FPMath
from graph_api.logical_tensor import LogicalTensor
from graph_api.op import Op
from kernels.reference import REFERENCE, TABLES, RefContext
from tests.cases.op_cases import EXACT, OP_CASES
from tests.cases.records import bf16_rne, f16_rne, tf32_rne

FORWARD_KINDS = {k for k in OpKind if "Backward" not in k.name}


def run(case, inputs, op=None):
    op = op or case.make_op()
    ctx = RefContext(fpmath=FPMath.make(case.fpmath))
    return REFERENCE[case.kind](op, inputs, op.outputs, ctx)


def assert_matches(got, want, tol, what=""):
    """Exact for integer/bool outputs and EXACT records, else allclose."""
    got = np.asarray(got)
    if got.dtype.kind in "iub" or tol is EXACT:
        np.testing.assert_array_equal(got.astype(np.float64), np.asarray(want, np.float64),
                                      err_msg=what)
    else:
        np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64),
                                   rtol=tol.rtol, atol=tol.atol, err_msg=f"{what}: {tol.why}")


# ------------------------------------------------------------------ the cases
@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.name)
def test_op_case(case):
    inputs = case.make_inputs()
    before = [x.copy() for x in inputs]
    outs = run(case, inputs)
    assert len(outs) == len(case.outputs)
    expected = case.expected(inputs, dict(case.attrs))
    for i, (got, spec, want) in enumerate(zip(outs, case.outputs, expected)):
        assert got.dtype == dtypes.numpy_dtype(DataType[spec.dtype]), f"output {i} dtype"
        assert got.shape == tuple(spec.shape), f"output {i} shape"
        # expected arrays may keep reduced dims: only the element order matters
        want = np.reshape(want, spec.shape)
        assert_matches(got, want, case.tolerance(i), f"{case.name} output {i}")
    for x, y in zip(inputs, before):  # inputs never modified (bitwise, NaN-safe)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def test_every_forward_op_has_a_kernel_and_cases():
    assert set(REFERENCE) == FORWARD_KINDS
    assert sum(len(t) for t in TABLES) == len(REFERENCE), "a kind is in two tables"
    counts = {}
    for case in OP_CASES:
        counts[case.kind] = counts.get(case.kind, 0) + 1
    missing = {k.name for k in FORWARD_KINDS - {OpKind.Wildcard} if counts.get(k, 0) < 2}
    assert not missing


def test_cases_follow_the_opset():
    """Each case is a valid op for the opset, and the schema defaults do not change
    the reference result (kernels read attrs with the same defaults)."""
    from graph_api.opset import OP_SCHEMAS
    from graph_api.schema import verify_op

    for case in OP_CASES:
        op = case.make_op()
        verify_op(op, OP_SCHEMAS)
        inputs = case.make_inputs()
        for got, want in zip(run(case, inputs, op), run(case, inputs)):
            assert got.tobytes() == want.tobytes(), case.name
