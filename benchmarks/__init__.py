"""The benchmark of the trainer: its table against Keras, dist_train.py and the machine.

Run from the repository's root: python -m benchmarks (--help lists the flags).
"""
