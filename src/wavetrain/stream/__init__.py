"""The feature stream: a recording's gram (source), windows, a bounded worker pool (scheduler),
batches and the stream that puts them together. ``windows`` and ``batches`` sit below the models,
which read windows in batches; ``source``, ``scheduler`` and ``feature_stream`` above them.
"""
