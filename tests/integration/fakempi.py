"""An in-process stand-in for mpi4py's communicator, so that ranks run as threads of one test:
point-to-point messages matched as MPI matches them (per source and tag, in the order sent;
a posted receive takes a message before a probe can see it), nonblocking barriers, Split
and Abort: what the parameter servers and their workers call. Messages are copied when sent
(an eager protocol)."""
from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
from mpi4py import MPI


class Aborted(Exception):
    """MPI_Abort: the job would end here."""


class Shutdown(Exception):
    """The test is over: a thread still waiting gives up."""


class Request:
    def __init__(self, test=lambda: True, cancel=lambda: None):
        self._test, self._cancel, self._done = test, cancel, False

    def Test(self) -> bool:
        self._done = self._done or self._test()
        return self._done

    def Wait(self) -> None:
        while not self.Test():
            time.sleep(1e-4)

    def Cancel(self) -> None:
        self._cancel()
        self._done = True


class Network:
    def __init__(self, size: int):
        self.size = size
        self.lock = threading.Lock()
        # (dest) -> messages not yet matched: (source, tag, copy of the data)
        self.unexpected: dict[int, deque] = {r: deque() for r in range(size)}
        # (dest) -> posted receives not yet matched: [source, tag, buffer, filled flag]
        self.posted: dict[int, list] = {r: [] for r in range(size)}
        self.barrier_arrivals: dict[int, set[int]] = {}
        self.dead: set[int] = set()
        self.aborts: list[tuple[int, int]] = []
        self.down = False

    def comm(self, rank: int) -> "Comm":
        return Comm(self, rank)

    def shutdown(self) -> None:
        self.down = True


def _deliver(data: np.ndarray, buf: np.ndarray) -> None:
    """As MPI: a message may be shorter than the receive buffer, never longer."""
    flat = buf.reshape(-1)
    if data.size > flat.size:
        raise ValueError(f"message of {data.size} elements truncated by a buffer of {flat.size}")
    flat[:data.size] = data.reshape(-1)


def _matches(source: int, tag: int, msg_source: int, msg_tag: int) -> bool:
    return source in (MPI.ANY_SOURCE, msg_source) and tag in (MPI.ANY_TAG, msg_tag)


class Comm:
    def __init__(self, net: Network, rank: int):
        self.net, self.rank = net, rank
        self._barriers = 0

    def _check(self) -> None:
        if self.net.down:
            raise Shutdown()

    def Isend(self, buf: np.ndarray, dest: int, tag: int) -> Request:
        self._check()
        data = np.array(buf, copy=True)
        with self.net.lock:
            if dest not in self.net.dead:
                for recv in self.net.posted[dest]:
                    if not recv[3] and _matches(recv[0], recv[1], self.rank, tag):
                        _deliver(data, recv[2])
                        recv[3] = True
                        self.net.posted[dest].remove(recv)
                        break
                else:
                    self.net.unexpected[dest].append((self.rank, tag, data))
        return Request()

    def _take(self, source: int, tag: int):
        for msg in self.net.unexpected[self.rank]:
            if _matches(source, tag, msg[0], msg[1]):
                self.net.unexpected[self.rank].remove(msg)
                return msg
        return None

    def Irecv(self, buf: np.ndarray, source: int, tag: int) -> Request:
        self._check()
        with self.net.lock:
            msg = self._take(source, tag)
            if msg is not None:
                _deliver(msg[2], buf)
                return Request()
            recv = [source, tag, buf, False]
            self.net.posted[self.rank].append(recv)

        def test() -> bool:
            self._check()
            return recv[3]

        def cancel() -> None:
            with self.net.lock:
                if recv in self.net.posted[self.rank]:
                    self.net.posted[self.rank].remove(recv)
        return Request(test, cancel)

    def Recv(self, buf: np.ndarray, source: int, tag: int) -> None:
        self.Irecv(buf, source, tag).Wait()

    def Iprobe(self, source: int, tag: int, status: MPI.Status) -> bool:
        self._check()
        with self.net.lock:
            for msg_source, msg_tag, data in self.net.unexpected[self.rank]:
                if _matches(source, tag, msg_source, msg_tag):
                    status.Set_source(msg_source)
                    status.Set_tag(msg_tag)
                    status.Set_elements(MPI.DOUBLE if data.dtype == np.float64 else MPI.FLOAT,
                                        data.size)
                    return True
        return False

    def Ibarrier(self) -> Request:
        """Completes once every live rank has entered the same barrier."""
        self._check()
        generation = self._barriers
        self._barriers += 1
        with self.net.lock:
            self.net.barrier_arrivals.setdefault(generation, set()).add(self.rank)

        def test() -> bool:
            self._check()
            with self.net.lock:
                live = set(range(self.net.size)) - self.net.dead
                return live <= self.net.barrier_arrivals[generation]
        return Request(test)

    def Split(self, color: int, key: int) -> "Comm":
        """A communicator of this rank alone: the tests give PsSync's worker world a network
        of the workers' own when they need it."""
        return Network(1).comm(0)

    def Abort(self, code: int) -> None:
        with self.net.lock:
            self.net.aborts.append((self.rank, code))
        raise Aborted(f"rank {self.rank} aborted the job with code {code}")
