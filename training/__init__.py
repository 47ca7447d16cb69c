"""What every trainer and evaluator of this project shares; it imports no program.

Importing the package imports nothing else (onednn must be importable before
TensorFlow is): take the modules by name, `from training import checkpoints`.
"""
