"""shm.replay: layout, attach checks, wrap-around, sampling distribution, export/restore,
and a writer process filling while this one samples (no torn or stale row is returned)."""
from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from rlinkd.shm.errors import LayoutError
from rlinkd.shm.records import StepLayout
from rlinkd.shm.replay import REPLAY_HEADER, ReplayBuffer, ReplayLayout


def layout(obs=4, actions=1) -> ReplayLayout:
    return ReplayLayout(StepLayout.flat(obs, actions, 2))


def rows_for(lay: ReplayLayout, positions: np.ndarray) -> np.ndarray:
    """Rows whose every field is derived from their absolute position p."""
    rows = lay.empty(len(positions))
    p = positions.astype(np.float32)
    rows["reward"], rows["discount"], rows["seq_no"] = p, 0.99, positions
    rows["action"][:, 0] = p
    rows["obs"]["obs"] = p[:, None]
    rows["next_obs"]["obs"] = p[:, None] + 1
    return rows


def consistent(rows: np.ndarray) -> bool:
    p = rows["reward"]
    return bool((rows["obs"]["obs"] == p[:, None]).all() and (rows["next_obs"]["obs"] == p[:, None] + 1).all()
                and (rows["action"][:, 0] == p).all() and (rows["seq_no"] == p.astype(np.int64)).all())


def test_layout_keeps_native_dtypes_and_round_trips():
    lay = layout()
    assert lay.row_bytes % 8 == 0 and lay.dtype.itemsize == lay.row_bytes
    assert ReplayLayout.from_json(lay.to_json()) == lay
    image = ReplayLayout(StepLayout((("img", "|u1", (84, 84, 4)), ("pos", "<i8", (2,))), 3, 0))
    assert image.dtype["obs"]["img"].base == np.uint8 and image.dtype["next_obs"]["img"].shape == (84, 84, 4)
    with pytest.raises(LayoutError, match="bytes a record"):
        ReplayLayout.from_json(lay.to_json() | {"row_bytes": 8})


def test_attach_checks_magic_layout_and_size(tmp_path):
    path = str(tmp_path / "r")
    buf = ReplayBuffer.create(path, layout(), 16)
    assert ReplayBuffer.attach(path, layout()).capacity == 16
    with pytest.raises(LayoutError):
        ReplayBuffer.attach(path, layout(obs=5))
    words = buf.segment.buf[:REPLAY_HEADER.size].cast("Q")
    words[2] = 1 << 40  # capacity beyond the file
    with pytest.raises(LayoutError, match="do not fit"):
        ReplayBuffer.attach(path)
    buf.segment.buf[:8] = b"XXXXXXXX"
    with pytest.raises(LayoutError):
        ReplayBuffer.attach(path)
    with pytest.raises(ValueError):
        ReplayBuffer.create(str(tmp_path / "z"), layout(), 0)


def test_wrap_around_keeps_the_newest_rows(tmp_path):
    lay = layout()
    buf = ReplayBuffer.create(str(tmp_path / "r"), lay, 10)
    assert buf.sample(4, np.random.default_rng(0)) is None and len(buf) == 0
    buf.append(rows_for(lay, np.arange(7)))
    buf.append(rows_for(lay, np.arange(7, 13)))   # wraps: rows 3..12 remain
    assert len(buf) == 10 and buf.written == 13
    assert sorted(buf.rows["seq_no"].tolist()) == list(range(3, 13))
    buf.append(rows_for(lay, np.arange(13, 38)))  # more than the capacity at once: the last 10
    assert sorted(buf.rows["seq_no"].tolist()) == list(range(28, 38)) and buf.written == 38
    saved, written = buf.export()
    assert saved["seq_no"].tolist() == list(range(28, 38)) and written == 38
    with pytest.raises(ValueError, match="dtype"):
        buf.append(np.zeros(3, np.float32))


def test_sampling_is_uniform_over_the_stored_rows(tmp_path):
    lay = layout()
    buf = ReplayBuffer.create(str(tmp_path / "r"), lay, 50)
    buf.append(rows_for(lay, np.arange(80)))  # rows 30..79 stored
    draws = np.concatenate([buf.sample(1000, np.random.default_rng(i))["seq_no"] for i in range(40)])
    counts = np.bincount(draws - 30, minlength=50)
    assert draws.min() == 30 and draws.max() == 79 and len(counts) == 50
    expected = len(draws) / 50
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 100  # 49 degrees of freedom: p < 1e-4 above ~95


def test_export_restore_round_trip(tmp_path):
    lay = layout()
    buf = ReplayBuffer.create(str(tmp_path / "a"), lay, 8)
    buf.append(rows_for(lay, np.arange(11)))
    saved, written = buf.export()
    other = ReplayBuffer.create(str(tmp_path / "b"), lay, 8)
    other.restore(saved, written)
    assert other.written == 11 and np.array_equal(np.sort(other.rows, order="seq_no"), saved)
    other.append(rows_for(lay, np.arange(11, 13)))
    assert sorted(other.rows["seq_no"].tolist()) == list(range(5, 13))
    with pytest.raises(ValueError, match="do not fit"):
        ReplayBuffer.create(str(tmp_path / "c"), lay, 4).restore(saved, written)


def _writer(path: str, total: int, chunk: int) -> None:
    buf = ReplayBuffer.attach(path)
    buf.set_pid("writer", mp.current_process().pid or 0)
    for start in range(0, total, chunk):
        buf.append(rows_for(buf.layout, np.arange(start, start + chunk)))
    buf.close()


def test_concurrent_fill_and_sample_never_returns_a_torn_or_overwritten_row(tmp_path):
    """A writer process laps a small buffer hundreds of times while this process samples:
    every sampled row is whole (all its fields from one write)."""
    lay = layout(obs=64)
    path = str(tmp_path / "r")
    buf = ReplayBuffer.create(path, lay, 1024)
    writer = mp.get_context("spawn").Process(target=_writer, args=(path, 400_000, 32))
    writer.start()
    rng, samples = np.random.default_rng(0), 0
    while writer.is_alive() or samples == 0:
        rows = buf.sample(64, rng)
        if rows is None:
            continue
        assert consistent(rows), "a torn row"
        samples += 1
    writer.join(30)
    assert writer.exitcode == 0 and buf.written == 400_000 and samples > 10
