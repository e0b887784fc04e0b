"""One ATen graph (static shapes) -> a graph_api Graph, its partitions, and the
FX graph rewritten so each supported partition is one call.

Steps (:func:`build`):

1. :class:`_Lowerer` walks the FX nodes in order and applies the rules of
   :mod:`torch_lower`; a node without a rule, or whose rule says no, stays a torch
   call (its reason is kept).  Values a lowered op reads from torch (inputs,
   parameters, torch-computed tensors) become graph inputs; parameters and
   buffers are ``constant`` logical tensors.
2. Ops nobody needs are dropped (a transpose folded into a MatMul), ``End``
   marks tensors that torch also reads, the graph is finalized and partitioned.
3. Each supported partition compiles for the concrete shapes and strides; a lone
   reshape/transpose partition stays a torch view (free there, a copy here).
4. The FX graph is rebuilt in dependency order: torch nodes copied, each
   partition one ``call_function`` of a :class:`PartitionCall`.

Anything the runtime refuses (``GraphError`` at add_op, finalize or compile)
takes the nodes it names out of the lowering, which then runs again.
"""
from __future__ import annotations

import heapq
import operator
import re
import threading
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.fx

import graph_api as ga
from graph_api import OpKind as K
from graph_api import PropertyType
from graph_api.errors import GraphError

from . import torch_lower as tl
from .torch_lower import NotLowered, meta

aten = torch.ops.aten

#: single-op partitions that a torch view does for free
VIEW_KINDS = {K.StaticReshape, K.StaticTranspose}
ENGINE = ga.Engine()
STREAM = ga.Stream(ENGINE)


class _Lowerer(tl.Lowering):
    def __init__(self, gm, args, constant: list[bool], excluded: dict):
        super().__init__()
        self.gm, self.args = gm, args
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.index = {n: i for i, n in enumerate(self.placeholders)}
        self.constant = constant
        self.excluded = excluded  # node -> why it may not lower (a runtime error)
        self._source_lt: dict = {}
        self.reasons: dict = {}  # FX node -> why it stays in torch
        self.packed_ids: set[int] = set()  # s4/u4 inputs fed as packed uint8 bytes

    def source(self, node):
        lt = self._source_lt.get(node)
        if lt is not None:
            return lt
        value = meta(node)
        if node.op == "call_function" and node.target == aten.scalar_tensor.default \
                and value.dtype.is_floating_point:
            array = np.array(float(node.args[0]), tl.NUMPY[tl.to_dtype(value.dtype)])
            lt = self._source_lt[node] = self.literal(array, tl.to_dtype(value.dtype))
            return lt
        prop = PropertyType.variable
        if node.op == "get_attr" or node.op == "placeholder" and self.constant[self.index[node]]:
            prop = PropertyType.constant
        lt = self._source_lt[node] = self.new_lt(tl.to_dtype(value.dtype), value.shape, prop)
        self.sources[lt.id] = ("node", node)
        return lt

    def packed_source(self, node, dtype, shape):
        """An s4/u4 constant [N, K] over a module's packed uint8 [N, K/2] buffer."""
        lt = self._source_lt.get((node, "packed"))
        if lt is None:
            self.constant_value(node)  # a buffer of the module, or not lowered
            lt = self._source_lt[(node, "packed")] = self.new_lt(dtype, shape, PropertyType.constant)
            self.sources[lt.id] = ("node", node)
            self.packed_ids.add(lt.id)
        return lt

    def constant_value(self, node) -> torch.Tensor:
        """The value of a parameter or buffer (constant data known while lowering)."""
        if node.op == "placeholder" and self.constant[self.index[node]]:
            return self.args[self.index[node]]
        if node.op == "get_attr":
            return getattr(self.gm, node.target)
        raise NotLowered(f"{node.name} is not a parameter or buffer of the module")

    def literal(self, array, dtype):
        lt = self.new_lt(dtype, array.shape, PropertyType.constant)
        self.sources[lt.id] = ("literal", array)
        return lt

    def run(self):
        for node in self.gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node in self.excluded:
                self.reasons[node] = self.excluded[node]
                continue
            rule = tl.RULES.get(node.target)
            if rule is None:
                self.reasons[node] = f"no rule for {node.target}"
                continue
            mark = len(self.ops)
            self.node = node
            try:
                self.lt_of[node] = rule(self, node)
            except NotLowered as why:
                del self.ops[mark:]
                self.reasons[node] = str(why)
            except (GraphError, KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
                del self.ops[mark:]
                self.reasons[node] = f"lowering failed: {type(err).__name__}: {err}"


def _torch_users(node, lowered) -> bool:
    return any(u.op == "output" or u not in lowered for u in node.users)


@dataclass
class Built:
    """The result of :func:`build`: the rewritten module and what the report counts."""

    module: torch.fx.GraphModule
    graph: object  # graph_api Graph (None: nothing lowered)
    calls: list  # PartitionCall per accepted partition
    lowerer: _Lowerer
    in_graph_api: set = field(default_factory=set)  # FX nodes computed by accepted partitions
    explained: dict = field(default_factory=dict)  # FX node name -> why its op did not fuse


class Retry(Exception):
    """Some nodes must stay in torch after all; lower again without them."""

    def __init__(self, nodes: dict):
        super().__init__(", ".join(n.name for n in nodes))
        self.nodes = nodes


def build(gm, args, constant, fpmath="strict", max_rounds=12) -> Built:
    """Lower, partition, compile and rewrite; retries without the nodes the runtime refused."""
    excluded: dict = {}
    for _ in range(max_rounds):
        try:
            return _build_once(gm, args, constant, fpmath, excluded)
        except Retry as retry:
            excluded.update(retry.nodes)
    raise ga.Unimplemented(f"the graph_api lowering did not settle after {max_rounds} rounds")


def _op_nodes(err, ops_by_id) -> dict:
    ids = [int(i) for i in re.findall(r"\bop (\d+)\b", str(err))]
    return {ops_by_id[i][1]: f"refused by graph_api: {err}" for i in ids if i in ops_by_id}


def _build_once(gm, args, constant, fpmath, excluded) -> Built:
    low = _Lowerer(gm, args, constant, excluded)
    low.run()
    lowered = {n for n, v in low.lt_of.items() if v is not None}
    # tensors torch (or the graph's output) reads from lowered nodes
    external = set()
    for node in lowered:
        value = low.lt_of[node]
        if isinstance(value, ga.LogicalTensor) and _torch_users(node, lowered):
            external.add(value.id)
    ops = _live_ops(low.ops, external)
    if not any(op.kind not in VIEW_KINDS for op, _ in ops):
        return Built(gm, None, [], low)
    graph = ga.Graph(ga.EngineKind.cpu, fpmath)
    ops_by_id = {op.id: (op, node) for op, node in ops}
    consumed = {lt.id for op, _ in ops for lt in op.inputs}
    next_op = max(ops_by_id) + 1
    try:
        for op, _ in ops:
            graph.add_op(op)
        for tid in sorted(external & consumed):
            lt = next(lt for op, _ in ops for lt in op.outputs if lt.id == tid) if tid not in low.sources else None
            if lt is not None:
                graph.add_op(ga.Op(next_op, K.End, [lt], [], name="torch_reads"))
                next_op += 1
        graph.finalize()
        partitions = graph.get_partitions()
    except GraphError as err:
        nodes = _op_nodes(err, ops_by_id)
        if not nodes:
            raise
        raise Retry(nodes) from err
    producer = {lt.id: op.id for op, _ in ops for lt in op.outputs}
    accepted, rejected = [], set()
    for part in partitions:
        if not part.is_supported():
            continue
        part_ops = [ops_by_id[i] for i in part.get_ops() if i in ops_by_id]
        nodes = {node for _, node in part_ops}
        whole = all(sum(1 for _, n in ops if n is node) == 1 for node in nodes)
        if len(part_ops) == 1 and part_ops[0][0].kind in VIEW_KINDS and whole:
            rejected.add(part_ops[0][1])  # a torch view is free
            continue
        accepted.append(part)
    # a node lowered as another's value (clone, a no-op view or cast) that torch reads
    # runs in torch too: torch needs eager's memory layout (a clone of a transposed view
    # is contiguous), graph_api only its values
    made = {}  # node -> ids of the tensors its own ops produce
    for op, node in low.ops:
        made.setdefault(node, set()).update(lt.id for lt in op.outputs)
    aliases = {n for n in lowered if n.target is not operator.getitem
               and isinstance(low.lt_of[n], ga.LogicalTensor) and low.lt_of[n].id not in made.get(n, ())}
    torch_too: set = set()
    while True:  # torch reads: torch nodes, views kept in torch, and these copies themselves
        in_ga = lowered - rejected - torch_too
        more = {n for n in aliases - torch_too if _torch_users(n, in_ga)}
        if not more:
            break
        torch_too |= more
    value_nodes = _value_nodes(low, lowered)
    by_rejected = {low.lt_of[n].id: n for n in rejected}

    def strided(tid):
        """An example of the value a partition input gets: its strides are compiled."""
        kind, what = low.sources.get(tid, ("value", None))
        if kind == "node":
            return args[low.index[what]] if what.op == "placeholder" else meta(what)
        if tid in by_rejected:
            return meta(by_rejected[tid])
        return None  # another partition's output: dense

    calls = []
    for part in accepted:
        try:
            calls.append(PartitionCall(part, low, args, value_nodes, ops_by_id, strided))
        except GraphError as err:
            nodes = {node: f"partition compile failed: {err}" for i in part.get_ops() if i in ops_by_id
                     for node in [ops_by_id[i][1]]}
            raise Retry(nodes) from err
    module = _rewrite(gm, low, lowered, rejected, torch_too, calls, producer, ops_by_id)
    in_ga = {node for call in calls for node in call.nodes}
    explained = {}
    try:
        for op_id, why in graph.explain_partitions().items():
            if op_id in ops_by_id and ops_by_id[op_id][1] in in_ga:
                explained[ops_by_id[op_id][1].name] = f"{ops_by_id[op_id][0].kind.name}: {why}"
    except GraphError:
        pass
    return Built(module, graph, calls, low, in_ga, explained)


def _live_ops(ops, external):
    """Ops whose results someone needs, walking back from what torch reads."""
    needed = set(external)
    live = []
    for op, node in reversed(ops):
        if any(lt.id in needed for lt in op.outputs):
            live.append((op, node))
            needed.update(lt.id for lt in op.inputs)
    return live[::-1]


def _value_nodes(low, lowered) -> dict:
    """tensor id -> the FX node whose value it is (for check mode and names)."""
    found = {}
    for node in low.gm.graph.nodes:
        value = low.lt_of.get(node) if node in lowered else None
        if isinstance(value, ga.LogicalTensor):
            found.setdefault(value.id, node)
    for tid, (kind, what) in low.sources.items():
        if kind == "node":
            found.setdefault(tid, what)
    return found


# ---------------------------------------------------------------- the partition call
def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (bf16 through its bits)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(tl.NUMPY[ga.DataType.bf16])
    return t.numpy()


TORCH_DTYPES = {v: k for k, v in tl.DTYPES.items()}


class PartitionCall:
    """One compiled partition as a callable of torch tensors -> tuple of torch tensors.

    Inputs are wrapped as graph_api Tensors over the tensors' own memory (numpy
    views, no copy): the partition is compiled for the strides the inputs have
    (a new stride pattern compiles once more, from the compiled-partition cache
    when seen before); an input with a zero stride (an expanded view) is made
    contiguous first.  Outputs are new contiguous torch tensors the kernels write
    into.  Constant inputs (parameters, literals) are wrapped once and kept while
    the same tensor object is passed.
    """

    def __init__(self, part, low, args, value_nodes, ops_by_id, strided):
        self.partition = part
        self.name = f"graph_api_p{part.id}_{part.get_kind().replace(' ', '_')}"
        self.__name__ = self.name
        self.nodes = sorted({ops_by_id[i][1] for i in part.get_ops() if i in ops_by_id},
                            key=lambda n: n.name)
        self.node_names = [n.name for n in self.nodes]
        self.in_ids = list(part.input_ids)
        self.out_ids = list(part.output_ids)
        self.var_ids = []  # inputs passed at call time, in order
        literals = {}
        for tid in self.in_ids:
            kind, what = low.sources.get(tid, ("value", None))
            if kind == "literal":
                literals[tid] = what
            else:
                self.var_ids.append(tid)
        self.value_nodes = value_nodes
        self.packed = {tid for tid in self.var_ids if tid in low.packed_ids}
        examples = [strided(tid) for tid in self.var_ids]
        self.lit_lts = {tid: ga.LogicalTensor(tid, part.graph.tensors[tid].dtype, list(a.shape),
                                              property=PropertyType.constant) for tid, a in literals.items()}
        self._fixed = [ga.Tensor(self.lit_lts[tid], ENGINE, a) for tid, a in literals.items()]
        self._variants: dict = {}
        self._key = None
        self._select([_stride_key(e) for e in examples])
        self.out_dtypes = [TORCH_DTYPES[lt.dtype] for lt in self.out_lts]
        self.out_shapes = [tuple(lt.shape) for lt in self.out_lts]
        self._bound: dict[int, tuple] = {}  # constant input id -> (torch tensor, Tensor)
        self.kernel = self.compiled.plan.name
        self.calls = 0
        #: outputs in buffers reused call after call (set by the rewrite when nothing escapes)
        self.reuse = False
        self._states: dict = {}  # thread id -> (inputs' memory, runner, outputs, strides key, input Tensors)
        self._copied = False

    def _select(self, strides):
        """Compile (or take from the variants) for these input strides."""
        key = tuple(strides)
        found = self._variants.get(key)
        if found is None:
            graph = self.partition.graph
            lts = []
            for tid, st in zip(self.var_ids, strides):
                port = graph.tensors[tid]
                usable = st is not None and tid not in self.packed and \
                    all(s > 0 for s, d in zip(st, port.shape) if d > 1)
                lts.append(ga.LogicalTensor(tid, port.dtype, list(port.shape),
                                            list(st) if usable else None, property=port.property))
            outs = [graph.tensors[t] for t in self.out_ids]
            compiled = self.partition.compile(lts + list(self.lit_lts.values()), outs, ENGINE)
            found = self._variants[key] = (compiled, lts, [compiled.query_logical_tensor(t) for t in self.out_ids])
            self._bound = {}
        self.compiled, self.var_lts, self.out_lts = found
        self._key = key

    def wrap(self, lt, t: torch.Tensor):
        """A graph_api Tensor over ``t``'s memory (a contiguous copy when its strides
        are not the compiled ones: then ``self._copied`` is set)."""
        if lt.id in self.packed:  # s4/u4: the packed bytes are the tensor's memory
            if t.dtype != torch.uint8 or t.numel() * 2 != lt.nelems():
                raise ga.InvalidShape(f"{self.name}: packed input {lt.id} is {t.dtype} {list(t.shape)}, "
                                      f"expected uint8 holding {list(lt.shape)} {lt.dtype.name}")
            if not t.is_contiguous():
                t, self._copied = t.contiguous(), True
            return ga.Tensor(lt, ENGINE, t.numpy().reshape(-1))
        if tuple(t.shape) != tuple(lt.shape) or tl.DTYPES.get(t.dtype) != lt.dtype:
            raise ga.InvalidShape(f"{self.name}: input {lt.id} is {t.dtype} {list(t.shape)}, compiled for "
                                  f"{lt.dtype.name} {list(lt.shape)}")
        if not _same_strides(t, lt):
            t, self._copied = t.contiguous(), True
        return ga.Tensor(lt, ENGINE, as_numpy(t))

    def _inputs(self, inputs) -> list:
        ins = list(self._fixed)
        bound = self._bound
        for lt, t in zip(self.var_lts, inputs):
            if lt.property == PropertyType.constant:
                kept = bound.get(lt.id)
                if kept is None or kept[0] is not t:
                    kept = bound[lt.id] = (t, self.wrap(lt, t))
                ins.append(kept[1])
            else:
                ins.append(self.wrap(lt, t))
        return ins

    def __call__(self, *inputs):
        key = tuple(_stride_key(t) for t in inputs)
        if key != self._key:
            self._select(key)
        self.calls += 1
        if self.reuse:
            return self._bound_call(inputs)
        ins = self._inputs(inputs)
        results = tuple(torch.empty(s, dtype=d) for s, d in zip(self.out_shapes, self.out_dtypes))
        outs = [ga.Tensor(lt, ENGINE, as_numpy(r)) for lt, r in zip(self.out_lts, results)]
        self.compiled.execute(STREAM, ins, outs)
        return results

    def _bound_call(self, inputs):
        """Outputs that only this graph's partitions and torch compute nodes read (never
        returned, never viewed by torch) live in buffers kept per thread; with the same
        input memory as last time the partition runs its bound form
        (``CompiledPartition.bind``: checks and per-call plan work done once).  The bound
        Tensors hold the inputs' memory, so an address seen again is the same tensor."""
        me = threading.get_ident()
        state = self._states.get(me)
        where = (self._key, tuple(t.data_ptr() for t in inputs))
        if state is not None and state[0] == where:
            state[1]()
            return state[2]
        if state is not None and state[3] == self._key:
            results = state[2]
        else:
            results = tuple(torch.empty(s, dtype=d) for s, d in zip(self.out_shapes, self.out_dtypes))
        self._copied = False
        ins = self._inputs(inputs)
        outs = [ga.Tensor(lt, ENGINE, as_numpy(r)) for lt, r in zip(self.out_lts, results)]
        runner = self.compiled.bind(STREAM, ins, outs)
        # an input copied to other strides is new memory each call: bind again next time
        self._states[me] = (None if self._copied else where, runner, results, self._key, ins)
        runner()
        return results


def _stride_key(value):
    """The strides an input is compiled for: its own, or None (dense) when a dim of
    size > 1 has a zero stride (an expanded view: made contiguous)."""
    if not isinstance(value, torch.Tensor):
        return None
    strides = tuple(value.stride())
    if any(s <= 0 for s, d in zip(strides, value.shape) if d > 1):
        return None
    return tuple(s if d > 1 else 0 for s, d in zip(strides, value.shape))


def _same_strides(t, lt) -> bool:
    return all(a == b for d, a, b in zip(t.shape, t.stride(), lt.strides) if d > 1)


# ---------------------------------------------------------------- the rewrite
def _rewrite(gm, low, lowered, rejected, torch_too, calls, producer, ops_by_id):
    """A new FX graph: torch nodes copied, each accepted partition one call."""
    torch_nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")
                   and (n not in lowered or n in rejected or n in torch_too)
                   and (n.users or n.target is not operator.getitem)]  # an unread output of a lowered tuple
    part_of = {tid: call for call in calls for tid in call.out_ids}
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    sources = {n for n in gm.graph.nodes if n.op in ("placeholder", "get_attr")}

    def unit_of_tid(tid):
        if tid in part_of:
            return part_of[tid]
        if tid in producer:
            node = ops_by_id[producer[tid]][1]
            if node in rejected:
                return node
            raise ga.InvalidGraph(f"tensor {tid} of {node.name} is not computed by any unit")
        kind, what = low.sources[tid]
        return unit_of_node(what) if kind == "node" else None

    def unit_of_node(node):
        if node in sources or node in torch_nodes_set:
            return node
        return unit_of_tid(low.lt_of[node].id)

    torch_nodes_set = set(torch_nodes)
    deps = {}
    for node in torch_nodes:
        deps[node] = {unit_of_node(a) for a in node.all_input_nodes}
    for call in calls:
        deps[call] = {unit_of_tid(t) for t in call.var_ids}
    for unit in deps:
        deps[unit] = {d for d in deps[unit] if d is not None and d not in sources}
    key = {n: position[n] for n in torch_nodes}
    key.update({c: min(position[n] for n in c.nodes) for c in calls})
    order = _topological(deps, key)

    new = torch.fx.Graph()
    env, tid_value = {}, {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = new.node_copy(node)
        elif node.op == "get_attr":
            env[node] = new.node_copy(node)

    def value_of_tid(tid):
        if tid in tid_value:
            return tid_value[tid]
        if tid in producer:
            return env[ops_by_id[producer[tid]][1]]
        return value_of_node(low.sources[tid][1])

    def value_of_node(node):
        if node in env:
            return env[node]
        return value_of_tid(low.lt_of[node].id)

    for unit in order:
        if isinstance(unit, PartitionCall):
            call = new.call_function(unit, tuple(value_of_tid(t) for t in unit.var_ids))
            call.name = unit.name
            for i, tid in enumerate(unit.out_ids):
                tid_value[tid] = new.call_function(_getitem, (call, i))
        else:
            env[unit] = new.node_copy(unit, value_of_node)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    new.output(torch.fx.map_arg(out.args[0], value_of_node))
    new.lint()
    for node in new.nodes:
        if isinstance(node.target, PartitionCall):
            node.target.reuse = all(not _escapes(user) for user in node.users)
    return torch.fx.GraphModule(gm, new)


def _escapes(node) -> bool:
    """Can this value (or a view of it) outlive the call: returned, or read by
    something that may alias it?  Partition calls and torch ops that are not views
    make new tensors from it; views are followed."""
    for user in node.users:
        if user.op == "output":
            return True
        if isinstance(user.target, PartitionCall):
            continue
        if user.target is _getitem or getattr(user.target, "is_view", True):
            if _escapes(user):
                return True
            if user.target is not _getitem and not isinstance(user.target, torch._ops.OpOverload):
                return True
    return False


def _getitem(values, i):
    return values[i]


def _topological(deps, key):
    users: dict = {u: [] for u in deps}
    missing = {u: len(d) for u, d in deps.items()}
    for u, ds in deps.items():
        for d in ds:
            users.setdefault(d, []).append(u)
    ready = [(key[u], id(u), u) for u, m in missing.items() if m == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, _, u = heapq.heappop(ready)
        order.append(u)
        for v in users.get(u, []):
            missing[v] -= 1
            if missing[v] == 0:
                heapq.heappush(ready, (key[v], id(v), v))
    if len(order) != len(deps):
        raise ga.InvalidGraph("the rewritten graph has a cycle between torch nodes and partitions")
    return order
