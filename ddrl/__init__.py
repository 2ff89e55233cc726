"""ddrl: distributed deep RL on Atari as HPC batch jobs."""
import os

# TensorFlow's C++ start-up chatter would bury the progress line and one-line errors. Set
# here, before any module imports TensorFlow, so that every entry point is quiet (the `ddrl`
# command, `python -m ddrl.bench.node`, library use); a user who sets TF_CPP_MIN_LOG_LEVEL
# gets what they asked for.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
