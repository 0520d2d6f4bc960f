"""What a fedsys process sets up for itself: the environment of its Flower and Ray
processes, glibc's heap, signals that stop a run, the run directory's lock, plain output
where nobody watches, and local processes followed through ``/proc``."""
