"""Evaluation: classification metrics, detection metrics (ROC, AUC, thresholds) and their plots.
"""
