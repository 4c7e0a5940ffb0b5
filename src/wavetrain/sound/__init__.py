"""``wavetrain sound``: tools that make data sets from data sets, each writing a metadata.csv.

One small module per tool: :mod:`~wavetrain.sound.partition` (stratified, group-safe splits),
:mod:`~wavetrain.sound.cut` (fixed-length clips), :mod:`~wavetrain.sound.splice` (one long
recording with segment rows), :mod:`~wavetrain.sound.augment` (noise, gain, frequency shift,
speed, pitch, reverb and mixing), :mod:`~wavetrain.sound.label` (a model's answers as segment
rows), :mod:`~wavetrain.sound.group` (a folder per label value) and
:mod:`~wavetrain.sound.audacity_io` (Audacity label tracks to and from segment rows).

Nothing is imported here, so that a tool loads only what it needs (``label`` loads the pipeline).
"""
