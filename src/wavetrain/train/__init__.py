"""Training of the neural classifiers: loop, shuffle buffer, schedules, stopping rules,
checkpoints, devices and the history plot.

Importing this package does not import torch; the modules that need it import it inside functions.
"""
from wavetrain.train.array_stream import ArrayStream, synthetic_stream
from wavetrain.train.history_plot import plot_history
from wavetrain.train.schedules import LRSchedule
from wavetrain.train.stopping import StopRules

__all__ = ["ArrayStream", "synthetic_stream", "LRSchedule", "StopRules", "plot_history"]
