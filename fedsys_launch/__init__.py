"""The launchers, above everything: the registry of methods and the config schema,
the Flower ServerApp and ClientApp, the command line, simulation and deployment."""
