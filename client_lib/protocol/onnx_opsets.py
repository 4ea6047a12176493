"""Which ONNX opsets can carry the graphs `netonnx` builds, and the IR version stamped with each.

Pure (no imports): the CLI reads the default without loading numpy or onnx.
"""
from __future__ import annotations

# The lowest opset at which each operator has the form emitted here: Clip with min/max inputs
# (11), Slice with starts/ends/axes inputs (10), Where (9), Expand (8), Add/Mul/Sub/Div/Gemm/
# Equal with multidirectional broadcasting (7), Cast/Relu/Tanh/Sigmoid without consumed_inputs
# (6), Concat with a required axis (4); Add and Sigmoid serve the recurrent cell only. No
# operator here changed its meaning in a later opset (later versions add types); Softmax,
# Reduce*, Split, whose semantics did change, are not emitted.
OPSET_SINCE = {"Cast": 6, "Mul": 7, "Sub": 7, "Div": 7, "Gather": 1, "Equal": 7, "Flatten": 1,
               "Transpose": 1, "Conv": 1, "Gemm": 7, "Tanh": 6, "Relu": 6, "Concat": 4,
               "Slice": 10, "Shape": 1, "Expand": 8, "Clip": 11, "Where": 9, "Add": 7, "Sigmoid": 6}
# The IR version each opset shipped with (ONNX releases 1.2-1.16); IR 4 at least, since the
# initializers are not graph inputs.
IR_VERSION_OF_OPSET = {7: 4, 8: 4, 9: 4, 10: 5, 11: 6, 12: 7, 13: 7, 14: 7, 15: 8, 16: 8,
                       17: 8, 18: 8, 19: 9, 20: 9, 21: 10}
ONNX_OPSET = max(OPSET_SINCE.values())  # 11
ONNX_IR_VERSION = IR_VERSION_OF_OPSET[ONNX_OPSET]


class OpsetError(ValueError):
    """An opset that cannot carry the network's operators, or one outside IR_VERSION_OF_OPSET."""


def check_opset(op_types: list[str], opset: int) -> None:
    """OpsetError naming every operator of `op_types` that `opset` lacks in the emitted form."""
    low, high = min(IR_VERSION_OF_OPSET), max(IR_VERSION_OF_OPSET)
    if opset not in IR_VERSION_OF_OPSET:
        raise OpsetError(f"opset {opset}: rlinkd writes opsets {low} to {high}")
    missing = sorted({t for t in op_types if OPSET_SINCE[t] > opset}, key=lambda t: (-OPSET_SINCE[t], t))
    if missing:
        lowest = max(low, *(OPSET_SINCE[t] for t in op_types))
        names = ", ".join(f"{t} (from opset {OPSET_SINCE[t]})" for t in missing)
        raise OpsetError(f"opset {opset} cannot carry {names}; this network needs opset "
                         f"{lowest} to {high}")
