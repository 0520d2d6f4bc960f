"""The simulation engines behind ``fedsys run``: Flower's own (Ray actors) and fedsys's
in-process engine, with its batched training and its workers on a Ray cluster, and the
shared Ray cluster that runs in a row may join."""
