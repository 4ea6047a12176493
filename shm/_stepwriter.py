"""Code generation of ``StepRing.write_step``, the single-step fast path.

Why generated code: for a CartPole-sized record the whole call budget is
about 1 us on the 2-core dev machine.  Measured there, ``pack_into(..., *obs,
*action, *dist)`` costs ~120 ns more than passing the floats as separate
arguments (building and converting the star-args tuple), and iterating a
numpy array costs ~4x ``ndarray.tolist()``.  Unpacking into fixed names
(``[o0, o1, o2, o3] = obs``) also checks the length exactly.  The sizes are
only known at run time, so the function is generated from the template
below with the variable lists filled in; nothing but identifiers derived
from three integers is ever interpolated.

Fast path types: obs/action/dist as ``list``/``tuple`` or 1-D numpy arrays;
a plain ``int``/``float`` action when ``action_size == 1``.  Anything else
(numpy scalars, 2-D arrays, other iterables) falls back to ``_flat_floats``,
which also produces the error message for wrong sizes.

The generated fast path exists for flat layouts only (one float32 obs field,
``StepLayout.is_flat``).  Any other layout gets ``_bind_generic``: the header
is packed with ``STEP_HEADER`` and obs/action/dist are copied through a numpy
view of the record slot (``StepLayout.write_obs``), so a uint8 image is copied
as bytes, never converted to floats.  Same signature, same publication and
RingFull behaviour; costs a few microseconds per step instead of ~1.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from rlinkd.shm.errors import RingFull
from rlinkd.shm.records import HAS_DIST, HAS_LOGP, STEP_HEADER, StepLayout
from rlinkd.shm._sync import fence_acquire, fence_release

_TEMPLATE = '''
def bind(pack_into, mapping, records_offset, record_bytes, capacity, tail_cell, head_cell,
         sleeping_cell, wake_reader, describe_ring):
    mask = capacity - 1
    head_seen = head_cell[0]
    zero_dist = (0.0,) * {dist_size}

    def write_step(flags, obs, action, reward, logp=None, dist=None, weights_seq_no=-1):
        nonlocal head_seen
        tail = tail_cell[0]
        if tail - head_seen >= capacity:
            head_seen = head_cell[0]
            if tail - head_seen >= capacity:
                raise RingFull(f"{{describe_ring()}} is full ({{capacity}} unread records)")
        if logp is None:
            logp = 0.0
        else:
            flags |= HAS_LOGP
        if dist is None:
            dist = zero_dist
        else:
            flags |= HAS_DIST
        try:
            [{obs_names}] = obs.tolist() if type(obs) is ndarray else obs
            {action_unpack}
            [{dist_names}] = dist.tolist() if type(dist) is ndarray else dist
        except (TypeError, ValueError):
            [{obs_names}] = flat_floats("obs", obs, {obs_size})
            [{action_names}] = flat_floats("action", action, {action_size})
            [{dist_names}] = flat_floats("dist", dist, {dist_size})
        pack_into(mapping, records_offset + (tail & mask) * record_bytes, flags, 0, weights_seq_no, 0,
                  reward, logp, {all_names})
        tail_cell[0] = tail + 1
        fence_acquire()
        fence_release()
        if sleeping_cell[0]:
            wake_reader()

    return write_step
'''

_SCALAR_ACTION = """if type(action) is int or type(action) is float:
                a0 = action
            else:
                [a0] = action.tolist() if type(action) is ndarray else action"""

_VECTOR_ACTION = "[{action_names}] = action.tolist() if type(action) is ndarray else action"


def _flat_floats(name: str, values, size: int) -> list:
    """Slow path: any array-like of ``size`` numbers -> list of Python floats."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if flat.size != size:
        raise ValueError(f"{name} has {flat.size} values, the step layout expects {size}")
    return flat.tolist()


def _names(letter: str, count: int) -> str:
    return ", ".join(f"{letter}{i}" for i in range(count))


@functools.lru_cache(maxsize=64)
def compile_step_writer(layout: StepLayout):
    """Return ``bind(...)``, which builds a ``write_step`` closure for one ring.

    Called once per StepRing (cached per layout); the returned function's contract is documented
    on ``StepRing.write_step``.  Non-flat layouts get the generic (numpy) writer.
    """
    if not layout.is_flat:
        return functools.partial(_bind_generic, layout)
    obs_size = math.prod(layout.obs_fields[0][2])
    names = {
        "obs_names": _names("o", obs_size),
        "action_names": _names("a", layout.action_size),
        "dist_names": _names("d", layout.dist_size),
    }
    action_unpack = _SCALAR_ACTION if layout.action_size == 1 else _VECTOR_ACTION.format(**names)
    all_names = ", ".join(n for n in names.values() if n)
    source = _TEMPLATE.format(
        obs_size=obs_size,
        action_size=layout.action_size,
        dist_size=layout.dist_size,
        action_unpack=action_unpack,
        all_names=all_names,
        **names,
    )
    namespace = {
        "RingFull": RingFull,
        "HAS_LOGP": HAS_LOGP,
        "HAS_DIST": HAS_DIST,
        "ndarray": np.ndarray,
        "flat_floats": _flat_floats,
        "fence_acquire": fence_acquire,
        "fence_release": fence_release,
    }
    code = compile(source, f"<shm.write_step O={obs_size} A={layout.action_size} D={layout.dist_size}>", "exec")
    exec(code, namespace)
    return namespace["bind"]


def _bind_generic(layout: StepLayout, pack_into, mapping, records_offset, record_bytes, capacity, tail_cell,
                  head_cell, sleeping_cell, wake_reader, describe_ring):
    """``bind`` for any layout: same arguments as the generated one (``pack_into`` unused: the
    header is packed with ``STEP_HEADER``; obs/action/dist go through a numpy view of the slot)."""
    records = np.frombuffer(mapping, layout.dtype, capacity, records_offset)
    obs_col, action_col, dist_col = records["obs"], records["action"], records["dist"]
    pack_header, mask = STEP_HEADER.pack_into, capacity - 1
    head_seen = head_cell[0]

    def write_step(flags, obs, action, reward, logp=None, dist=None, weights_seq_no=-1):
        nonlocal head_seen
        tail = tail_cell[0]
        if tail - head_seen >= capacity:
            head_seen = head_cell[0]
            if tail - head_seen >= capacity:
                raise RingFull(f"{describe_ring()} is full ({capacity} unread records)")
        slot = tail & mask
        layout.write_obs(obs_col[slot, ...], obs)
        action_col[slot] = _flat_floats("action", action, layout.action_size)
        dist_col[slot] = 0.0 if dist is None else _flat_floats("dist", dist, layout.dist_size)
        flags |= (0 if logp is None else HAS_LOGP) | (0 if dist is None else HAS_DIST)
        pack_header(mapping, records_offset + slot * record_bytes, flags, 0, weights_seq_no, 0,
                    reward, 0.0 if logp is None else logp)
        tail_cell[0] = tail + 1
        fence_acquire()
        fence_release()
        if sleeping_cell[0]:
            wake_reader()

    return write_step
