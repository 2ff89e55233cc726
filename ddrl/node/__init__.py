"""One rank's machinery: simulators, predictor threads, the experience FIFO, the trainer loop.

`ba3c.py` is the paper's node (asynchronous predictors feeding a FIFO), `a2c.py` the
synchronous variant, `learner.py` the network and its compiled steps, `trainer.py` the
update loop both modes share.
"""
