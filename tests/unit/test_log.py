"""The HDF5 run log, real files in-process: damaged logs are refused fast, live ones read,
older formats resume."""
from __future__ import annotations

import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from ddrl.errors import DdrlError, HardExitError, storage_errors
from ddrl.rundir import log as log_module
from ddrl.rundir.log import RunLog, open_log, read_table, table_dtype


def write_log(path: Path, episodes: int = 3000) -> RunLog:
    log = RunLog.create(path, {"config": "{}"})
    for i in range(episodes):
        log.append("episodes", {"rank": 0, "frames": 100 * i, "wall_time": float(i),
                                "return": float(i % 21), "length": 100})
    log.flush()
    return log


@pytest.mark.parametrize("keep", [4500, 0.5])
def test_a_log_cut_short_is_refused_with_its_sizes(tmp_path, keep):
    path = tmp_path / "log.h5"
    write_log(path).close()
    data = path.read_bytes()
    cut = keep if isinstance(keep, int) else int(len(data) * keep)
    path.write_bytes(data[:cut])
    with pytest.raises(DdrlError, match=f"cut short: {cut:,} of {len(data):,} bytes"):
        open_log(path)


def test_a_log_still_being_written_reads_through_swmr(tmp_path):
    path = tmp_path / "log.h5"
    log = write_log(path, episodes=10)
    try:
        with open_log(path) as f:
            assert len(read_table(f, "episodes")) == 10
    finally:
        log.close()


def test_not_a_log_is_refused(tmp_path):
    path = tmp_path / "log.h5"
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    with pytest.raises(DdrlError, match="not a readable HDF5 log"):
        open_log(path)


def test_an_older_format_resumes_with_new_columns_zero(tmp_path):
    path = tmp_path / "log.h5"
    old_train = [n for n in table_dtype("train").names if n != "nonfinite"]
    with h5py.File(path, "w", libver="latest") as f:
        for name in ("train", "episodes", "eval", "ranks", "servers"):
            dtype = table_dtype(name)
            if name == "train":
                dtype = np.dtype([(n, dtype[n]) for n in old_train])
            rows = np.zeros(3, dtype)
            if "update" in dtype.names:
                rows["update"] = [1, 2, 3]
            if name == "train":
                rows["loss"] = [0.5, 0.25, 0.125]
            f.create_dataset(name, data=rows, maxshape=(None,), chunks=(1024,))
        f.attrs["format_version"] = 2
    log = RunLog.resume(path, update=2, frames=200, restarts=1, attrs={})
    log.close()
    with open_log(path) as f:
        train = read_table(f, "train")
    assert train["update"].tolist() == [1, 2] and train["loss"].tolist() == [0.5, 0.25]
    assert train["nonfinite"].tolist() == [0, 0]


@pytest.mark.parametrize("resume", [False, True])
def test_the_log_gets_its_name_only_once_readers_can_open_it(tmp_path, monkeypatch, resume):
    """Until SWMR mode the writer holds HDF5's exclusive lock: a reader that found the file
    then failed with 'unable to lock file' (a live `ddrl analyze`, and once a flaky test)."""
    path = tmp_path / "log.h5"
    if resume:
        write_log(path, episodes=10).close()
    publish = RunLog._publish.__func__
    seen = []

    def check(cls, tmp, final, f, flush_seconds):
        seen.append((final.exists(), f.swmr_mode))
        log = publish(cls, tmp, final, f, flush_seconds)
        with h5py.File(final, "r", swmr=True) as reader:
            seen.append(len(reader["episodes"]))
        return log

    monkeypatch.setattr(RunLog, "_publish", classmethod(check))
    log = (RunLog.resume(path, 0, 500, 1, {}) if resume else RunLog.create(path, {}))
    log.close()
    assert seen == [(resume, False), 6 if resume else 0]
    assert [p.name for p in tmp_path.iterdir()] == ["log.h5"]


def damage_first_chunk(path: Path, table: str, nbytes: int = 64) -> None:
    """Random bytes over the start of the table's first chunk on disk, as a torn write or
    a bad disk leaves them."""
    with h5py.File(path, "r") as f:
        offset = f[table].id.get_chunk_info(0).byte_offset
    data = bytearray(path.read_bytes())
    data[offset:offset + nbytes] = np.random.default_rng(0).bytes(nbytes)
    path.write_bytes(bytes(data))


def test_damaged_bytes_in_a_table_are_reported_not_read_as_data(tmp_path):
    path = tmp_path / "log.h5"
    write_log(path).close()
    damage_first_chunk(path, "episodes")
    with open_log(path) as f:
        with pytest.raises(DdrlError, match="table /episodes of the log is damaged"):
            read_table(f, "episodes")
        assert len(read_table(f, "train")) == 0  # the other tables still read


def test_resuming_a_damaged_log_sets_it_aside_and_goes_on_with_what_reads(tmp_path):
    path = tmp_path / "log.h5"
    log = write_log(path)
    for u in range(1, 6):
        log.append("train", {"update": u, "loss": 0.5})
    log.close()
    damage_first_chunk(path, "episodes")
    before = path.read_bytes()
    log = RunLog.resume(path, update=3, frames=10**9, restarts=1, attrs={})
    log.close()
    assert "table /episodes" in log.damaged
    assert (tmp_path / "log.damaged-1.h5").read_bytes() == before
    with open_log(path) as f:
        assert read_table(f, "train")["update"].tolist() == [1, 2, 3]
        assert len(read_table(f, "episodes")) == 0


def test_resuming_a_log_cut_short_sets_it_aside_and_starts_a_new_one(tmp_path):
    path = tmp_path / "log.h5"
    write_log(path).close()
    damaged = path.read_bytes()[:4500]
    path.write_bytes(damaged)
    log = RunLog.resume(path, update=2, frames=200, restarts=1, attrs={"config": "{}"})
    log.close()
    assert "cut short" in log.damaged
    assert (tmp_path / "log.damaged-1.h5").read_bytes() == damaged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.damaged-1.h5", "log.h5"]
    with open_log(path) as f:
        assert f.attrs["config"] == "{}" and len(read_table(f, "episodes")) == 0


class BrokenMirror:
    """A mirror whose service went away (W&B's upload dying, a TensorBoard disk full)."""

    def __init__(self, hang_on_close: float = 0.0):
        self.writes, self.hang = 0, hang_on_close

    def write(self, table, rows, columns):
        self.writes += 1
        raise ConnectionError("the service is gone")

    def flush(self):
        pass

    def close(self):
        time.sleep(self.hang)


def test_a_failing_mirror_is_dropped_with_one_warning_and_the_log_goes_on(tmp_path, capsys):
    log = RunLog.create(tmp_path / "log.h5", {"config": "{}"})
    broken = BrokenMirror()
    log.mirrors.append(broken)
    for frames in range(5):
        log.append("episodes", {"rank": 0, "frames": frames, "wall_time": 0.0, "return": 1.0,
                                "length": 1})
        log.flush()
    log.close()
    assert broken.writes == 1 and not log.mirrors
    err = capsys.readouterr().err
    assert err.count("ddrl: warning: the BrokenMirror mirror failed (the service is gone)") == 1
    with h5py.File(tmp_path / "log.h5", "r") as f:
        assert len(f["episodes"]) == 5


class FullDiskMirror:
    """A mirror writing a file on a full disk (/dev/full), as TensorBoard's beside the log."""

    def write(self, table, rows, columns):
        with storage_errors("/dev/full"), open("/dev/full", "ab") as f:
            f.write(b"event")

    def flush(self):
        pass

    def close(self):
        pass


def test_a_mirror_on_a_full_disk_ends_the_run_on_one_error_not_a_warning(tmp_path, capsys):
    """Its disk is the log's: a warning, then the log's error a moment later, was two lines
    for one fault, in whichever order the writes met the full disk."""
    log = RunLog.create(tmp_path / "log.h5", {"config": "{}"})
    log.mirrors.append(FullDiskMirror())
    log.append("episodes", {"rank": 0, "frames": 1, "wall_time": 0.0, "return": 1.0,
                            "length": 1})
    with pytest.raises(HardExitError, match="/dev/full: No space left on device") as raised:
        log.flush()
    assert raised.value.exit_code == 2  # final, not a fault that may pass
    assert "warning" not in capsys.readouterr().err


def test_a_mirror_that_hangs_at_close_does_not_hold_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(log_module, "MIRROR_CLOSE_S", 0.5)
    log = RunLog.create(tmp_path / "log.h5", {"config": "{}"})
    log.mirrors.append(BrokenMirror(hang_on_close=30.0))
    start = time.monotonic()
    log.close()
    assert time.monotonic() - start < 5
    assert "did not close within 0.5 s" in capsys.readouterr().err


def test_a_resumed_run_finds_a_confirmed_target_in_its_log_and_only_a_confirmed_one(tmp_path):
    """RootRecords.confirmed: a crossing over 10 games, or a cut evaluation at the target, is
    not a confirmed target; the confirmation's row over 50 games is, flushed or still buffered."""
    from ddrl.loop.bookkeeping import Counters
    from ddrl.loop.progress import Progress
    from ddrl.loop.records import RootRecords

    log = RunLog.create(tmp_path / "log.h5", {})
    records = RootRecords(log, Counters(), Progress(10.0, 0, 0.0), tmp_path)
    log.append("eval", {"update": 10, "mean_return": 21.0, "episodes": 10, "cut": 0})
    log.append("eval", {"update": 12, "mean_return": 21.0, "episodes": 50, "cut": 1})
    log.flush()
    assert not records.confirmed(18.0, 50) and records.confirmed(18.0, 10)
    log.append("eval", {"update": 10, "mean_return": 19.6, "episodes": 50, "cut": 0})
    assert records.confirmed(18.0, 50) and not records.confirmed(20.0, 50)
    assert not records.confirmed(None, 50)
    log.close()


def test_a_resumed_run_takes_the_waits_charged_to_its_pause_share_from_its_log(tmp_path):
    """RootRecords.waits: the ranks' waits for evaluations of eval.episodes games or fewer, in
    order; a confirmation's (50 games) and the background's (0 s) are not charged."""
    from ddrl.loop.bookkeeping import Counters
    from ddrl.loop.progress import Progress
    from ddrl.loop.records import RootRecords

    log = RunLog.create(tmp_path / "log.h5", {})
    records = RootRecords(log, Counters(), Progress(10.0, 0, 0.0), tmp_path)
    for update, games, held in ((2, 10, 0.0), (4, 10, 3.5), (6, 10, 2.0), (6, 50, 24.0),
                                (8, 7, 20.0)):
        log.append("eval", {"update": update, "episodes": games, "held": held, "cut": 1})
    assert records.waits(10) == [3.5, 2.0, 20.0]
    log.close()
