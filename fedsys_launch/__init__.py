"""The launchers, above everything, in rooms by role: :mod:`~fedsys_launch.apps` (the
Flower ServerApp and ClientApp), :mod:`~fedsys_launch.engines` (the simulation engines),
:mod:`~fedsys_launch.deploy` (a real deployment), :mod:`~fedsys_launch.commands` (the
``fedsys`` command line) and :mod:`~fedsys_launch.process` (what a process sets up for
itself); beside them the config schema (:mod:`~fedsys_launch.config_schema`), every change
to Flower's own code (:mod:`~fedsys_launch.flower_patches`, with
:mod:`~fedsys_launch.runtime_auth`) and the docs tooling (:mod:`~fedsys_launch.recording`)."""
