"""Training of the neural classifiers: the loop, step strategies, callbacks, shuffle buffer,
schedules, stopping rules, checkpoints and the history plot.

Importing this package does not import torch; the modules that need it import it inside functions.
"""
from wavetrain.train.array_stream import ArrayStream
from wavetrain.train.callbacks import Callback, Halt, HaltAfter
from wavetrain.train.history_plot import plot_history
from wavetrain.train.schedules import LRSchedule
from wavetrain.train.stopping import StopRules

__all__ = ["ArrayStream", "Callback", "Halt", "HaltAfter", "LRSchedule", "StopRules", "plot_history"]
