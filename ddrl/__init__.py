"""ddrl: distributed deep RL on Atari as HPC batch jobs."""
import os

# TensorFlow's C++ start-up chatter would bury the progress line and one-line errors. Set
# here, before any module imports TensorFlow, so that every entry point is quiet (the `ddrl`
# command, `python -m ddrl.bench.node`, library use); a user who sets TF_CPP_MIN_LOG_LEVEL
# gets what they asked for.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow 2.16 and later make tf.keras Keras 3 unless told otherwise; ddrl's models,
# optimizer and Horovod's variable broadcast use the Keras 2 API, which tf-keras keeps.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
