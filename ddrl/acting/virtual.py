"""Rehearsal: one process carries k ranks of a bigger job (`sync.virtual_ranks`).

Each virtual rank is the actors the real rank would have had: its own simulators, seeded with
that rank's number (process rank x k + i), its own FIFO or replay memory, its own minibatch
order. They share the process's one model. The trainer computes a gradient on each one's
batch in turn, with the same weights, and hands their sum to the all-reduce, which divides by
the job's N x k ranks: the update a job of N x k real ranks would apply, bit for bit where
the sum's order is the same (two ranks' a + b always is).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ddrl.acting.base import Actors
from ddrl.algos.batch import Batch


def _shared(name: str) -> property:
    """An attribute every virtual rank holds alike: read from the first, set on all."""
    def set_all(self, value) -> None:
        for m in self.members:
            setattr(m, name, value)
    return property(lambda self: getattr(self.members[0], name), set_all)


class VirtualRanks(Actors):
    """The trainer sees one rank's counters (summed over the virtual ranks) and takes a batch
    from each of `ranks()`."""

    def __init__(self, members: list[Actors]):
        # Not Actors.__init__: the counters it sets live in the members, read through here.
        self.cfg, self.learner, self.rank = members[0].cfg, members[0].learner, members[0].rank
        self.members = members

    def ranks(self) -> list[Actors]:
        return self.members

    # The trainer sets these on the one object it knows; every virtual rank acts on them.
    update = _shared("update")
    progress = _shared("progress")

    @property
    def frames(self) -> int:
        return sum(m.frames for m in self.members)

    @property
    def t_sim(self) -> float:
        return sum(m.t_sim for m in self.members)

    @property
    def t_predict(self) -> float:
        return sum(m.t_predict for m in self.members)

    def check_memory(self, local_ranks: int) -> None:
        # Every virtual rank holds what a real one would: k of them per process.
        self.members[0].check_memory(local_ranks * len(self.members))

    def start(self, stopping: Callable[[], bool]) -> None:
        for m in self.members:
            m.start(stopping)

    def next_batch(self) -> Batch | None:
        raise TypeError("a process with virtual ranks has a batch per rank: iterate ranks()")

    def pop_episodes(self) -> list[tuple[float, int]]:
        return [e for m in self.members for e in m.pop_episodes()]

    def pop_rows(self, updates: int) -> dict[str, list[dict[str, float]]]:
        rows: dict[str, list[dict[str, float]]] = {}
        for m in self.members:
            for table, more in m.pop_rows(updates).items():
                rows.setdefault(table, []).extend(more)
        return rows

    def save_state(self, directory: Path, update: int) -> None:
        for m in self.members:
            m.save_state(directory, update)

    def restore_state(self, directory: Path, update: int) -> None:
        for m in self.members:
            m.restore_state(directory, update)

    def close(self) -> None:
        for m in self.members:
            m.close()
