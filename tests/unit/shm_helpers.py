"""Helpers for the shared-memory unit tests.

Numbered step records for the StepRing tests (one process and across processes):
record ``i`` carries ``i`` in ``weights_seq_no`` and ``obs[0]`` and ``i / 2`` in
``reward``, so a reader can tell exactly which records it got and in what order.
"""
import numpy as np

from rlinkd.shm.records import StepLayout

LAYOUT = StepLayout.flat(4, 1, 2)


def numbered(start, count):
    """``count`` records numbered ``start``, ``start + 1``, ..."""
    records = LAYOUT.empty(count)
    numbers = np.arange(start, start + count)
    records["weights_seq_no"] = numbers
    records["obs"]["obs"][:, 0] = numbers
    records["reward"] = numbers * 0.5
    return records


def assert_numbered(records, start):
    """Raise AssertionError unless ``records`` are exactly those numbered from ``start``."""
    numbers = np.arange(start, start + len(records))
    if not (np.array_equal(records["weights_seq_no"], numbers)
            and np.array_equal(records["obs"]["obs"][:, 0], numbers.astype(np.float32))
            and np.array_equal(records["reward"], (numbers * 0.5).astype(np.float32))):
        raise AssertionError(f"expected records {start}..{start + len(records) - 1}, got "
                             f"{records['weights_seq_no'][:8].tolist()}...")


def set_header_field(segment, header, index, value):
    """Overwrite field ``index`` of the ``header`` struct at offset 0 of ``segment``
    (to forge a bad header that ``attach`` must refuse)."""
    fields = list(header.unpack_from(segment.buf, 0))
    fields[index] = value
    header.pack_into(segment.buf, 0, *fields)
