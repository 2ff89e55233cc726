"""Named layouts for the flat numeric messages ranks exchange.

MPI moves buffers of one dtype; a Schema gives each slot a name so that senders pack and
receivers unpack by field instead of by offset, and adding a figure is one edit where the
layout is declared.
"""
from __future__ import annotations

from typing import Union

import numpy as np

Field = Union[str, tuple[str, int]]


class Schema:
    """Fields in order: a name is one scalar slot, (name, n) a block of n slots."""

    def __init__(self, *fields: Field, dtype: np.dtype | type = np.float64):
        self.dtype = np.dtype(dtype)
        self._slices: dict[str, slice] = {}
        self._scalar: set[str] = set()
        offset = 0
        for f in fields:
            name, width = (f, 1) if isinstance(f, str) else f
            if name in self._slices:
                raise ValueError(f"field {name!r} appears twice")
            if width < 0:
                raise ValueError(f"field {name!r} has negative width {width}")
            if isinstance(f, str):
                self._scalar.add(name)
            self._slices[name] = slice(offset, offset + width)
            offset += width
        self.size = offset

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._slices)

    def empty(self) -> np.ndarray:
        return np.zeros(self.size, self.dtype)

    def pack(self, **values) -> np.ndarray:
        """A new buffer with the given fields set and the rest zero."""
        buf = self.empty()
        for name, value in values.items():
            self.set(buf, name, value)
        return buf

    def set(self, buf: np.ndarray, name: str, value) -> None:
        """A block may be given in part: `value` fills it from the start."""
        sl = self._slice(name)
        if np.ndim(value) and len(value) < sl.stop - sl.start:
            sl = slice(sl.start, sl.start + len(value))
        buf[sl] = value

    def add(self, buf: np.ndarray, name: str, value) -> None:
        buf[self._slice(name)] += value

    def get(self, buf: np.ndarray, name: str):
        """A scalar field as a Python float, a block as a view into `buf`."""
        part = buf[self._slice(name)]
        return float(part[0]) if name in self._scalar else part

    def unpack(self, buf: np.ndarray) -> dict:
        if buf.size < self.size:
            raise ValueError(f"message of {buf.size} slots, layout needs {self.size}")
        return {name: self.get(buf, name) for name in self._slices}

    def _slice(self, name: str) -> slice:
        try:
            return self._slices[name]
        except KeyError:
            raise KeyError(f"no field {name!r} in layout {self.names}") from None
