"""The jobs behind the commands (train, evaluate, k-fold, classify), written once against an engine
(:mod:`~wavetrain.pipeline.engine`: this process, or Spark), the memory planner and predictions.
"""
