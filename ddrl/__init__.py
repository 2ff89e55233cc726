"""ddrl: distributed deep RL on Atari as HPC batch jobs."""
import os
import platform

from ddrl.heap import cap_arenas
from ddrl.output import quiet_tensorflow_import

# Before any thread starts, since glibc fixes its arenas' limit early: rank 0's memory over a
# long run grew with each arena its threads filled (ddrl/heap.py).
cap_arenas()

# TensorFlow's C++ start-up chatter would bury the progress line and one-line errors. Set
# here, before any module imports TensorFlow, so that every entry point is quiet (the `ddrl`
# command, `python -m ddrl.bench.node`, library use); a user who sets TF_CPP_MIN_LOG_LEVEL
# gets what they asked for.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow 2.18 logs a few lines while it loads whatever that variable says: the first
# import of TensorFlow drops them (ddrl/output.py).
quiet_tensorflow_import()
# TensorFlow 2.16 and later make tf.keras Keras 3 unless told otherwise; ddrl's models,
# optimizer and Horovod's variable broadcast use the Keras 2 API, which tf-keras keeps.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# On Linux TensorFlow turns its oneDNN kernels on by itself only for x86 CPUs with AVX-512 VNNI
# or BF16, AVX-VNNI or AMX (its DefaultOneDnnPolicy); on the others (AMD EPYC Zen 2 and 3, AVX2
# or older AVX-512 Xeons) it runs Eigen's, which took 1.2-2.1x the time of oneDNN's for a DQN
# update and had half its network throughput for PPO on an AVX2 EPYC (docs/performance.md).
# TF_ENABLE_ONEDNN_OPTS=0 still chooses Eigen.
if platform.machine().lower() in ("x86_64", "amd64"):
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
