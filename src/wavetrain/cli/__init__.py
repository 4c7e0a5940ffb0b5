"""The ``wavetrain`` command line."""
