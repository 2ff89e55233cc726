"""The job's training loop (`trainer.py`), its state between updates (`bookkeeping.py`), the
background evaluator, the progress line and the injected faults of the straggler and fault
tests."""
