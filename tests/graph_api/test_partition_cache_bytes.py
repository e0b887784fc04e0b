"""The compiled-partition cache bounded by bytes as well as entries (issue 33):
entries count the prepared copies of their constants; the least recently used
go while the total passes the bound."""
import pytest

import graph_api as ga
from graph_api import DataType as dt
from graph_api import OpKind as K
from graph_api import partition_cache
from graph_api.partition_cache import CompiledPartitionCache


class Entry:
    def __init__(self, held_bytes):
        self.held_bytes = held_bytes


def test_entries_go_least_recently_used_first_when_bytes_pass_the_bound():
    cache = CompiledPartitionCache(capacity=100)
    cache.set_byte_capacity(1000)
    for i in range(3):
        cache.put(("p", i), Entry(400))
    assert len(cache) == 2 and cache.held_bytes() == 800 and cache.get(("p", 0)) is None
    cache.get(("p", 1))  # now the most recent: entry 2 goes next
    cache.put(("p", 3), Entry(300))
    assert cache.get(("p", 2)) is None and cache.get(("p", 1)) is not None and cache.held_bytes() == 700


def test_an_entry_bigger_than_the_bound_is_not_kept_and_lowering_evicts():
    cache = CompiledPartitionCache(capacity=100)
    cache.set_byte_capacity(1000)
    cache.put("big", Entry(1001))
    assert len(cache) == 0 and cache.held_bytes() == 0
    cache.put("a", Entry(600))
    cache.put("b", Entry(0))
    cache.set_byte_capacity(500)
    assert cache.get("a") is None and cache.get("b") is not None and cache.held_bytes() == 0


def test_replacing_a_key_counts_its_bytes_once():
    cache = CompiledPartitionCache(capacity=100)
    cache.set_byte_capacity(None)
    cache.put("a", Entry(10))
    cache.put("a", Entry(30))
    assert cache.held_bytes() == 30 and len(cache) == 1


def test_the_default_is_half_the_memory_budget_and_the_variable_sets_it(monkeypatch):
    from graph_api import config

    monkeypatch.setattr(config.settings, "memory_budget_bytes", 1 << 30)
    assert CompiledPartitionCache().byte_capacity() == 1 << 29
    assert CompiledPartitionCache(byte_capacity_text="64M").byte_capacity() == 64 << 20
    assert CompiledPartitionCache(byte_capacity_text="unlimited").byte_capacity() is None
    with pytest.raises(ga.InvalidArguments, match="GRAPH_API_PARTITION_CACHE_BYTES"):
        CompiledPartitionCache(byte_capacity_text="lots").byte_capacity()


@pytest.mark.parametrize("bad", [-1, 1.5, "8G", True])
def test_set_bytes_rejects_what_is_not_an_int(bad):
    with pytest.raises(ga.InvalidArguments, match="cache bytes"):
        ga.set_compiled_partition_cache_bytes(bad)


def test_compiled_partitions_with_constants_are_evicted_by_bytes():
    """Three MatMuls with a constant 64x64 f32 weight (16 KiB prepared each) under a
    40 KiB bound: two stay; the first compiles again."""
    def graph():
        g = ga.Graph()
        w = ga.LogicalTensor(1, dt.f32, [64, 64], property=ga.PropertyType.constant)
        g.add_op(ga.Op(0, K.MatMul, [ga.LogicalTensor(0, dt.f32, [2, 64]), w], [ga.LogicalTensor(2, dt.f32, [2, 64])]))
        g.finalize()
        return g.get_partitions()[0]

    parts = [graph() for _ in range(3)]
    ga.set_compiled_partition_cache_bytes(40 << 10)
    try:
        compiled = [p.compile(p.get_input_ports(), p.get_output_ports(), ga.Engine()) for p in parts]
        assert all(c.held_bytes == 64 * 64 * 4 for c in compiled)
        assert partition_cache.CACHE.held_bytes() <= 40 << 10
        again = parts[0].compile(parts[0].get_input_ports(), parts[0].get_output_ports(), ga.Engine())
        assert again is not compiled[0]
        last = parts[2].compile(parts[2].get_input_ports(), parts[2].get_output_ports(), ga.Engine())
        assert last is compiled[2]
    finally:
        ga.set_compiled_partition_cache_bytes(None)
