"""A core's arithmetic bound from what /proc/cpuinfo says of it: the denominator of the node's
FLOP-bound ratio (`ddrl bench node`)."""
from __future__ import annotations

import pytest

from ddrl import cpus

ZEN4 = {"vendor_id": "AuthenticAMD", "cpu family": "25", "flags": "fma avx2 avx512f avx512_bf16"}
ZEN5 = {"vendor_id": "AuthenticAMD", "cpu family": "26", "flags": "fma avx2 avx512f avx512_bf16"}
SPR = {"vendor_id": "GenuineIntel", "cpu family": "6",
       "flags": "fma avx2 avx512f avx512_bf16 amx_bf16"}
ZEN3 = {"vendor_id": "AuthenticAMD", "cpu family": "25", "flags": "fma avx2"}
OLD = {"vendor_id": "GenuineIntel", "cpu family": "6", "flags": "sse4_2"}


@pytest.mark.parametrize("info, fp32, bf16", [
    (ZEN3, 32, None), (ZEN4, 32, 64), (ZEN5, 64, 128), (SPR, 64, 1024), (OLD, None, None)])
def test_flops_per_cycle_follow_the_generation(monkeypatch, info, fp32, bf16):
    monkeypatch.setattr(cpus, "cpuinfo", lambda: info)
    for precision, expected in (("float32", fp32), ("bfloat16", bf16)):
        peak = cpus.peak_flops_per_cycle(precision)
        assert (peak and peak[0]) == expected, (precision, peak)
