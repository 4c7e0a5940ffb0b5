"""The lowest layer: errors, parameters, safe outputs, progress, devices, thread defaults and signal helpers
that every other layer may import.
"""
