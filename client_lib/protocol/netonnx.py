"""ONNX interpreter of the op list in `netops`: build the graph once, refresh weights by memcpy.

Graph inputs: one per observation leaf the outputs need, named by `netops.input_name`
("onnx::Gemm_0" for a root float32 leaf, "obs" for another root leaf, "obs.<key>" otherwise;
the action-mask leaf is an input too), shape ["batch", *record_shape], dtype = the leaf's
record dtype (uint8 images are fed as uint8 and cast in the graph); a recurrent network adds
"state_in" float32 ["batch", S] (`recurrent`). Outputs: `action_dist_inputs` float32
["batch", dist_size], with `with_value=True` (daemon-internal, the connector) `value` float32
["batch", 1], and for a recurrent network "state_out" float32 ["batch", S] last. The cell is
unrolled into Gemm/Add/Sigmoid/Tanh/Mul/Sub/Slice/Concat (its weights stay verbatim
initializers, so OnnxWeightWriter patches them like any other). Initializers: the layout-named parameters the
outputs read (raw float32 data, layout order), then small constants named "<value>/...".
onnx is imported inside the functions: processes that never build a graph do not pay for it.

Opset: every graph is stamped with one opset (default ``ONNX_OPSET``, the lowest that carries
every operator this module emits) and the IR version that opset shipped with
(``IR_VERSION_OF_OPSET``), so engines with an older runtime load it; ``opset=`` picks another
(``OpsetError`` when it cannot carry the network's operators).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol import netops as N
from rlinkd.client_lib.protocol.onnx_opsets import (IR_VERSION_OF_OPSET, ONNX_IR_VERSION, ONNX_OPSET,
                                                    OpsetError, check_opset)

__all__ = ["IR_VERSION_OF_OPSET", "ONNX_IR_VERSION", "ONNX_OPSET", "OnnxWeightWriter", "OpsetError",
           "build_onnx_model", "check_opset"]

def _const(consts: list, name: str, value: np.ndarray) -> str:
    from onnx import numpy_helper
    consts.append(numpy_helper.from_array(value, name=name))
    return name


def _nodes(op: N.Op, consts: list) -> list:
    """The ONNX nodes computing `op` (constants appended to `consts`)."""
    from onnx import TensorProto
    from onnx.helper import make_node as node
    out = op.out
    if isinstance(op, N.Cast):
        return [node("Cast", [op.x], [out], to=TensorProto.FLOAT)]
    if isinstance(op, N.Scale):
        return [node("Mul", [op.x, _const(consts, f"{out}/factor", np.asarray(op.factor, np.float32))], [out])]
    if isinstance(op, N.Normalize):
        return [node("Sub", [op.x, op.mean], [f"{out}/centered"]),
                node("Div", [f"{out}/centered", op.std], [out])]
    if isinstance(op, N.OneHot):
        cols = _const(consts, f"{out}/columns", np.asarray(op.columns, np.int64))
        vals = _const(consts, f"{out}/values", np.asarray(op.values, np.int64))
        return [node("Gather", [op.x, cols], [f"{out}/picked"], axis=1),
                node("Equal", [f"{out}/picked", vals], [f"{out}/hit"]),
                node("Cast", [f"{out}/hit"], [out], to=TensorProto.FLOAT)]
    if isinstance(op, N.Flatten):
        return [node("Flatten", [op.x], [out], axis=1)]
    if isinstance(op, N.ToNCHW):
        return [node("Transpose", [op.x], [out], perm=[0, 3, 1, 2])]
    if isinstance(op, N.Conv):
        return [node("Conv", [op.x, op.weight, op.bias], [out], strides=[op.stride] * 2)]
    if isinstance(op, N.Linear):
        return [node("Gemm", [op.x, op.weight, op.bias], [out], transB=1)]
    if isinstance(op, N.Act):
        return [node("Tanh" if op.kind == "tanh" else "Relu", [op.x], [out])]
    if isinstance(op, N.Concat):
        return [node("Concat", list(op.xs), [out], axis=1)]
    if isinstance(op, N.Slice):
        return [_slice(op.x, out, op.start, op.stop, consts)]
    if isinstance(op, N.Tile):
        return [node("Shape", [op.x], [f"{out}/shape"]),
                node("Expand", [op.param, f"{out}/shape"], [out])]
    if isinstance(op, N.Clip):
        bounds = [_const(consts, f"{out}/{what}", np.asarray(v, np.float32))
                  for what, v in (("low", op.low), ("high", op.high))]
        return [node("Clip", [op.x, *bounds], [out])]
    if isinstance(op, N.Mask):
        masked = _const(consts, f"{out}/masked", np.asarray(N.MASKED_LOGIT, np.float32))
        return [_slice(op.mask, f"{out}/mask", op.start, op.stop, consts),
                node("Cast", [f"{out}/mask"], [f"{out}/legal"], to=TensorProto.BOOL),
                node("Where", [f"{out}/legal", op.x, masked], [out])]
    if isinstance(op, N.Recurrent):
        return _cell_nodes(op, consts)
    raise TypeError(f"no ONNX implementation of {type(op).__name__}")


def _slice(x: str, out: str, start: int, stop: int, consts: list):
    from onnx.helper import make_node
    bounds = [_const(consts, f"{out}/{what}", np.asarray([v], np.int64))
              for what, v in (("starts", start), ("ends", stop), ("axes", 1))]
    return make_node("Slice", [x, *bounds], [out])


def _cell_nodes(op: N.Recurrent, consts: list) -> list:
    """One step of the cell (maths in `recurrent`) from Gemm, Add, Sigmoid, Tanh, Mul, Sub."""
    from onnx.helper import make_node as node
    out, size, lstm = op.out, op.size, op.cell == "lstm"
    h = f"{out}/h_prev" if lstm else op.state
    nodes = [_slice(op.state, h, 0, size, consts),
             _slice(op.state, f"{out}/c_prev", size, 2 * size, consts)] if lstm else []
    nodes += [node("Gemm", [op.x, op.weight_ih, op.bias_ih], [f"{out}/gi"], transB=1),
              node("Gemm", [h, op.weight_hh, op.bias_hh], [f"{out}/gh"], transB=1)]
    if lstm:  # LSTM: gate blocks of gi + gh; GRU: of gi and gh apart (n needs r * gh_n)
        nodes.append(node("Add", [f"{out}/gi", f"{out}/gh"], [f"{out}/gates"]))
        sources = [(f"{out}/gates", "ih")]
    else:
        sources = [(f"{out}/gi", "ih"), (f"{out}/gh", "hh")]
    for k in range(4 if lstm else 3):
        nodes += [_slice(src, f"{out}/{tag}{k}", k * size, (k + 1) * size, consts)
                  for src, tag in sources]
    return nodes + (_lstm_tail(out) if lstm else _gru_tail(out, h))


def _lstm_tail(out: str) -> list:
    from onnx.helper import make_node as node
    g = [f"{out}/ih{k}" for k in range(4)]  # i, f, g, o pre-activations
    return [node("Sigmoid", [g[0]], [f"{out}/i"]), node("Sigmoid", [g[1]], [f"{out}/f"]),
            node("Tanh", [g[2]], [f"{out}/g"]), node("Sigmoid", [g[3]], [f"{out}/o"]),
            node("Mul", [f"{out}/f", f"{out}/c_prev"], [f"{out}/fc"]),
            node("Mul", [f"{out}/i", f"{out}/g"], [f"{out}/ig"]),
            node("Add", [f"{out}/fc", f"{out}/ig"], [f"{out}/c"]),
            node("Tanh", [f"{out}/c"], [f"{out}/tanh_c"]),
            node("Mul", [f"{out}/o", f"{out}/tanh_c"], [f"{out}/h"]),
            node("Concat", [f"{out}/h", f"{out}/c"], [out], axis=1)]


def _gru_tail(out: str, h: str) -> list:
    """h' = n + z * (h - n), which is (1 - z) * n + z * h."""
    from onnx.helper import make_node as node
    return [node("Add", [f"{out}/ih0", f"{out}/hh0"], [f"{out}/r_pre"]),
            node("Sigmoid", [f"{out}/r_pre"], [f"{out}/r"]),
            node("Add", [f"{out}/ih1", f"{out}/hh1"], [f"{out}/z_pre"]),
            node("Sigmoid", [f"{out}/z_pre"], [f"{out}/z"]),
            node("Mul", [f"{out}/r", f"{out}/hh2"], [f"{out}/r_hn"]),
            node("Add", [f"{out}/ih2", f"{out}/r_hn"], [f"{out}/n_pre"]),
            node("Tanh", [f"{out}/n_pre"], [f"{out}/n"]),
            node("Sub", [h, f"{out}/n"], [f"{out}/h_minus_n"]),
            node("Mul", [f"{out}/z", f"{out}/h_minus_n"], [f"{out}/z_diff"]),
            node("Add", [f"{out}/n", f"{out}/z_diff"], [out])]


def _outputs(with_value: bool) -> tuple[str, ...]:
    return (N.DIST, N.VALUE) if with_value else (N.DIST,)


def _graph_outputs(spec: Any, with_value: bool) -> tuple[str, ...]:
    """The graph outputs: `_outputs`, then the new state for a recurrent network."""
    return _outputs(with_value) + ((N.STATE_OUT,) if spec.net.state_width else ())


def build_onnx_model(spec: Any, flat: np.ndarray | None = None, with_value: bool = False,
                     opset: int = ONNX_OPSET):
    """The network of `spec` as an ONNX ModelProto (see the module doc for inputs/outputs),
    parameters from `flat` (zeros if None), stamped `opset` and its IR version. Build once per
    spec; refresh weights with OnnxWeightWriter.encode. ValueError on a wrong-size `flat`,
    OpsetError when `opset` cannot carry the network."""
    from onnx import TensorProto, helper, numpy_helper
    net, outputs = spec.net, _graph_outputs(spec, with_value)
    params = spec.split_flat(np.zeros(spec.n_params(), np.float32) if flat is None else flat)
    consts: list = []
    nodes = [n for op in net.needed(outputs) if not isinstance(op, (N.Input, N.State))
             for n in _nodes(op, consts)]
    check_opset([n.op_type for n in nodes], opset)
    inits = [numpy_helper.from_array(np.asarray(params[n], np.float32), name=n)
             for n in net.param_names(outputs)]
    inputs = [helper.make_tensor_value_info(
        op.out, helper.np_dtype_to_tensor_dtype(np.dtype(op.dtype)), ["batch", *op.shape])
        for op in net.inputs(outputs)]
    inputs += [helper.make_tensor_value_info(op.out, TensorProto.FLOAT, ["batch", op.width])
               for op in net.states(outputs)]
    widths = {N.DIST: spec.dist_size, N.VALUE: 1, N.STATE_OUT: net.state_width}
    outs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", widths[name]])
            for name in outputs]
    graph = helper.make_graph(nodes, "rlinkd_policy", inputs, outs, initializer=inits + consts)
    model = helper.make_model(graph, producer_name="rlinkd",
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION_OF_OPSET[opset]
    return model


class OnnxWeightWriter:
    """ONNX bytes for new weights without rebuilding the graph or touching protobuf.

    The model is built and serialised once, with every parameter initializer's raw data set
    to a unique random pattern; the offsets of those patterns in the serialised bytes are
    remembered, and ``encode`` copies the new float32 weights over them. Each encode is one
    copy of the template plus a memcpy per parameter (milliseconds even for a Nature CNN).
    (Mutating one protobuf ModelProto per version instead leaked: upb frees replaced bytes
    fields only with the whole message, ~30 KB per version.) Works for every architecture:
    only the initializers' bytes change between versions. Not thread-safe.
    """

    def __init__(self, spec: Any, with_value: bool = False, opset: int = ONNX_OPSET) -> None:
        self.spec = spec
        self.model = build_onnx_model(spec, with_value=with_value, opset=opset)
        self._names = spec.net.param_names(_graph_outputs(spec, with_value))
        self.template, self._targets = self._patchable_template()

    def _slices(self) -> dict[str, tuple[int, int]]:
        slices, offset = {}, 0
        for name, shape in self.spec.param_layout():
            slices[name] = (offset, offset + math.prod(shape))
            offset += math.prod(shape)
        return slices

    def _patchable_template(self) -> tuple[bytes, list[tuple[int, int, int]]]:
        """Serialise with random markers; retry with other markers in the (astronomically
        rare) case one occurs twice. ValueError if no marker set can be located."""
        slices, inits = self._slices(), {t.name: t for t in self.model.graph.initializer}
        for seed in range(8):
            rng = np.random.default_rng((0x0DDBA11, seed))
            markers = {n: rng.bytes(4 * (slices[n][1] - slices[n][0])) for n in self._names}
            for name, marker in markers.items():
                inits[name].raw_data = marker
            template = self.model.SerializeToString()
            targets = []
            for name, marker in markers.items():
                at = template.find(marker)
                if at < 0 or template.find(marker, at + 1) >= 0:
                    break
                targets.append((*slices[name], at))
            else:
                return template, targets
        raise ValueError("cannot locate the initializers in the serialised model")

    def encode(self, flat: np.ndarray) -> bytes:
        """ONNX model bytes carrying `flat` (layout order). ValueError on a wrong-size vector."""
        flat = np.ascontiguousarray(flat, dtype="<f4")  # ONNX raw_data is little-endian
        if flat.shape != (self.spec.n_params(),):
            raise ValueError(f"flat weights have shape {flat.shape}, "
                             f"expected ({self.spec.n_params()},)")
        out = bytearray(self.template)
        raw = flat.data.cast("B")  # no copy
        for start, stop, at in self._targets:
            out[at:at + 4 * (stop - start)] = raw[4 * start:4 * stop]
        return bytes(out)
