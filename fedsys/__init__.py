"""fedsys core: config, data, partitions, models, parameter maths, checkpoints, metrics."""

__version__ = "0.1.0"
