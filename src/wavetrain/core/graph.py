"""A small builder of ONNX graphs: what the feature front-end and every model family write their
computation into when a model is exported (``wavetrain export``).

Nodes are collected as plain tuples and turned into an ``onnx.ModelProto`` by :meth:`Graph.model`,
so building needs no ``onnx`` import until the end (the ``export`` extra). Values are named by the
builder; :meth:`Graph.op` returns the output name(s). Reductions are written once for every opset
(their ``axes`` moved from an attribute to an input at opset 18).
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = ["DEFAULT_OPSET", "OPSETS", "Graph"]

#: The opset a graph is written for unless another is asked for.
DEFAULT_OPSET = 17
#: The opsets a graph can be written for.
OPSETS = range(17, 21)

_ONNX_TYPES = {np.dtype(np.float32): 1, np.dtype(np.int64): 7, np.dtype(np.float64): 11, np.dtype(np.bool_): 9}
#: ONNX element types by name (for Cast's ``to``).
FLOAT, INT64, DOUBLE, BOOL = 1, 7, 11, 9


class Graph:
    """Nodes and constants of one ONNX graph under construction.

    Parameters
    ----------
    opset : int
        The ONNX opset the nodes are written for.
    """

    def __init__(self, opset: int = DEFAULT_OPSET):
        self.opset = int(opset)
        self.nodes: list[tuple[str, list[str], list[str], dict[str, Any], str, str]] = []
        self.constants: dict[str, np.ndarray] = {}
        self.subgraphs: list[Any] = []          # onnx GraphProtos whose initializers join this graph
        self._count = 0
        self._scope = ""
        self._const_ids: dict[tuple, str] = {}

    # -- naming ---------------------------------------------------------------------------------
    def name(self, hint: str = "v") -> str:
        self._count += 1
        return f"{self._scope}{hint}_{self._count}"

    @contextmanager
    def scope(self, prefix: str):
        """Names of nodes and values made inside start with ``prefix/`` (e.g. ``features/``,
        ``model/``: what quantisation tells apart)."""
        outer = self._scope
        self._scope = f"{outer}{prefix}/"
        try:
            yield
        finally:
            self._scope = outer

    # -- constants and nodes --------------------------------------------------------------------
    def const(self, value: Any, dtype: Any = None, hint: str = "c") -> str:
        """An initializer holding ``value`` (small integer and float constants are shared)."""
        a = np.asarray(value, dtype=dtype)
        if a.dtype not in _ONNX_TYPES:
            a = a.astype(np.float32 if a.dtype.kind == "f" else np.int64)
        key = None
        if a.size <= 16:
            key = (a.dtype.str, a.shape, a.tobytes())
            if key in self._const_ids:
                return self._const_ids[key]
        name = self.name(hint)
        self.constants[name] = np.array(a, order="C")      # (a 0-d array stays a scalar)
        if key is not None:
            self._const_ids[key] = name
        return name

    def i64(self, *values: int) -> str:
        """A 1-D int64 constant."""
        return self.const(np.array(values, dtype=np.int64), hint="i")

    def op(self, op_type: str, *inputs: str, outputs: int = 1, domain: str = "", **attrs: Any):
        """Add a node; returns its output name (a list of names when ``outputs`` > 1)."""
        outs = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append((op_type, list(inputs), outs, attrs, domain, self.name(f"{op_type}_node")))
        return outs[0] if outputs == 1 else outs

    def output(self, name: str, value: str) -> None:
        """Make ``value`` a graph output called ``name``."""
        self.nodes.append(("Identity", [value], [name], {}, "", self.name("output")))

    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: bool = True) -> str:
        """``Reduce*`` over ``axes``, written for this graph's opset."""
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.op(op_type, x, self.i64(*axes), keepdims=int(keepdims))
        return self.op(op_type, x, axes=list(axes), keepdims=int(keepdims))

    # -- shape helpers --------------------------------------------------------------------------
    def dim(self, x: str, axis: int) -> str:
        """The length of ``x`` along ``axis`` as a 1-element int64 tensor."""
        return self.op("Gather", self.op("Shape", x), self.i64(axis), axis=0)

    def scalar(self, x: str) -> str:
        """A 1-element tensor as a scalar."""
        return self.op("Squeeze", x, self.i64(0))

    def cast(self, x: str, to: int) -> str:
        return self.op("Cast", x, to=to)

    # -- the model ------------------------------------------------------------------------------
    def model(self, inputs: Sequence[tuple[str, int, list]], outputs: Sequence[tuple[str, int, list]],
              metadata: dict[str, str] | None = None, *, doc: str = ""):
        """The ``onnx.ModelProto``: ``inputs``/``outputs`` as ``(name, element type, shape)``
        (shape entries: ints or names of symbolic dimensions), metadata properties as strings."""
        import onnx
        from onnx import helper, numpy_helper

        nodes = [helper.make_node(t, ins, outs, name=name, domain=dom or None, **attrs)
                 for t, ins, outs, attrs, dom, name in self.nodes]
        inits = [numpy_helper.from_array(v, name=k) for k, v in self.constants.items()]
        for sub in self.subgraphs:
            inits.extend(sub.initializer)
        used = {n for node in nodes for n in _read_names(node)} | {n for n, _, _ in outputs}
        inits = [i for i in inits if i.name in used]     # a shared constant no node reads is not kept
        graph = helper.make_graph(nodes, "wavetrain", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                                  [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                                  initializer=inits, doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="wavetrain")
        model.ir_version = min(model.ir_version, 9)     # what onnxruntime releases of the last years read
        for k, v in (metadata or {}).items():
            model.metadata_props.add(key=k, value=v)
        onnx.checker.check_model(model)
        return model

    def inline(self, sub, inputs: dict[str, str], prefix: str) -> dict[str, str]:
        """Add the nodes of ``sub`` (an ``onnx.GraphProto``, e.g. a network exported by torch) with
        every name prefixed, its inputs bound to ``inputs`` (sub's input name -> a value of this
        graph); returns sub's outputs by their names -> names in this graph."""
        from onnx import helper

        def rename(n: str) -> str:
            return inputs.get(n) or (f"{self._scope}{prefix}/{n}" if n else n)

        for init in sub.initializer:
            init.name = rename(init.name)
        for node in sub.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            self.nodes.append((node.op_type, [rename(i) for i in node.input], [rename(o) for o in node.output],
                               attrs, node.domain, rename(node.name or self.name("n"))))
        self.subgraphs.append(sub)
        return {o.name: rename(o.name) for o in sub.output}


def _read_names(node) -> set[str]:
    """The names an ``onnx.NodeProto`` reads: its inputs and those of the nodes of its sub-graphs
    (a Scan's body reads constants of the outer graph by name)."""
    from onnx import AttributeProto

    names = set(node.input)
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for g in graphs:
            for n in g.node:
                names |= _read_names(n)
    return names

