"""Sparse test data shared by the sparse tests: one matrix per encoding."""
import numpy as np

from graph_api import sparse_encoding as se

ENCODINGS = {"CSR": se.csr(), "CSC": se.csc(), "COO": se.coo(), "DCSR": se.dcsr(),
             "BCSR2x4": se.bcsr(2, 4), "BCSR4x4": se.bcsr(4, 4), "2:4": se.nm()}


def sparse_matrix(name, shape=(8, 12), density=0.35, seed=0):
    """Random f32 data that the encoding can hold (2:4: at most 2 non-zeros per 1x4 block),
    with an empty row and an empty column so that empty segments are exercised."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    a[rng.random(shape) > density] = 0
    if name == "2:4":
        blocks = a.reshape(shape[0], -1, 4)
        place = np.argsort(np.argsort(-np.abs(blocks), axis=2), axis=2)  # 0 = largest in its block
        blocks[place >= 2] = 0
        a = blocks.reshape(shape)
    a[1, :] = 0
    a[:, 2] = 0
    return a
