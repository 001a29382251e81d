"""The ops on the compiled kernels, one module per family: what the kernels need and
decide nothing about (the layout and dtypes of their arrays, output buffers, TF's
reduction plans, the thread model through ``tfgrad._compile``), then the kernel calls.

``tfgrad.ops.<family>`` imports its module here when the kernels are selected (never at
its own import: the ops load without Numba); this package imports no ``tfgrad.ops`` and
``tfgrad.kernels`` none of it.
"""
