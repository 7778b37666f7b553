"""simsparse: a discrete-event simulator of sparse collectives for data-parallel
deep learning, with a real mpi4py+torch backend running the same algorithms."""
__version__ = "0.1.0"
