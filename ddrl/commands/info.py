"""`ddrl info`: library versions, the MPI library, CPU features, TensorFlow's devices, and model
sizes."""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform

from ddrl.cpus import cpu_flags, cpuinfo

# An older install may hold tensorflow-cpu instead of tensorflow: `info` names whichever is there.
TENSORFLOW = ("tensorflow", "tensorflow-cpu")
PACKAGES = ("tf-keras", "horovod", "mpi4py", "ale-py", "gymnasium", "h5py", "numpy")
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    found = [(pkg, version(pkg)) for pkg in TENSORFLOW]
    out.update([next(((p, v) for p, v in found if v != "not installed"), found[0])])
    out.update((pkg, version(pkg)) for pkg in PACKAGES)
    out["mpi"] = mpi_library()
    return out


def version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def devices() -> str:
    """What TensorFlow would run on: its CPU and each GPU it sees (by name), and whether this
    build of TensorFlow has CUDA at all, so that a GPU that is not used says why."""
    import tensorflow as tf

    names = []
    for dev in tf.config.list_physical_devices():
        kind, index = dev.name.split(":")[-2:]
        detail = (tf.config.experimental.get_device_details(dev).get("device_name")
                  if kind == "GPU" else None)
        names.append(f"{kind}:{index}" + (f" ({detail})" if detail else ""))
    return f"{', '.join(names)}; built with CUDA: {'yes' if tf.test.is_built_with_cuda() else 'no'}"


def mpi_library() -> str:
    try:
        from mpi4py import MPI

        # Open MPI's string ends in a NUL, which makes grep call `info`'s output binary.
        return MPI.Get_library_version().splitlines()[0].strip().rstrip("\x00")
    except Exception as exc:  # mpi4py without a working MPI still lets `info` report the rest
        return f"unavailable ({exc.__class__.__name__})"


def horovod_build() -> str:
    try:
        import horovod.tensorflow as hvd

        return f"mpi={hvd.mpi_built()} gloo={hvd.gloo_built()}"
    except Exception as exc:
        return f"unavailable ({exc.__class__.__name__}: {exc})"


def cpu_features() -> list[str]:
    flags = cpu_flags()
    return [f for f in CPU_FLAGS if f in flags]


def cpu_summary() -> str:
    """The CPU's model name, cores available to this process and vector features: what every
    measured figure is quoted with."""
    fields = cpuinfo()
    model = fields.get("model name") or platform.processor() or platform.machine()
    # Virtual machines often name the CPU only "AMD EPYC" or "Intel Xeon Processor": the family
    # and model numbers are what tell its generation (AMD family 26 is Zen 5, 25 Zen 3 or 4).
    if "cpu family" in fields and "model" in fields:
        model += f" (family {fields['cpu family']}, model {fields['model']})"
    # oneDNN (TensorFlow's CPU kernels) runs no wider than ONEDNN_MAX_CPU_ISA: a figure taken
    # under it stands for a CPU with that ISA, not for the one the features name.
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA")
    # Without oneDNN TensorFlow runs Eigen's kernels: up to half the speed (ddrl/__init__.py).
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "")
    return (f"{model}, {len(os.sched_getaffinity(0))} cores, "
            f"features: {' '.join(cpu_features()) or '-'}"
            + (f", oneDNN limited to {isa.lower()} (ONEDNN_MAX_CPU_ISA)" if isa else "")
            + (f", oneDNN off (TF_ENABLE_ONEDNN_OPTS={onednn})"
               if onednn.strip().lower() in ("0", "false") else ""))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", nargs="*", metavar="ARCH",
                   help="print parameter count and forward FLOPs per observation of these nets")


def run(args: argparse.Namespace) -> int:
    for k, v in versions().items():
        print(f"{k:16s} {v}")
    print(f"{'horovod build':16s} {horovod_build()}")
    print(f"{'cpu':16s} {cpu_summary()}")
    print(f"{'devices':16s} {devices()}")
    if args.model is not None:
        from ddrl.config import ModelConfig
        from ddrl.models import build_model, forward_flops

        for arch in args.model or ["ddrl", "nature", "a3c"]:
            shape = (4,) if arch == "mlp" else (4, 84, 84)
            model = build_model(ModelConfig(arch=arch), shape, 6)
            print(f"model {arch:8s} params {model.count_params():>10,}  "
                  f"forward {forward_flops(model) / 1e6:9.2f} MFLOP/obs")
    return 0
