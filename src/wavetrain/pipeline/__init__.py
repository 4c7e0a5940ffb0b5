"""The local engine's jobs behind the commands (train, evaluate, k-fold, classify), the memory
planner and predictions.
"""
