"""The ``fedsys`` command line: its parser and subcommands, ``fedsys deploy``, the results
tables, ``fedsys pretrain`` and ``fedsys landscape``."""
