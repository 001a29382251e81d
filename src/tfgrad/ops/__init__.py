"""Op families: semantics, validation and the plain NumPy reference of each op.

One module per family. Each defines, for every op of the family, a function named as
the TF op (``FakeQuantWithMinMaxArgs``) that takes the validated keyword arguments
(inputs as NumPy arrays of the right dtype, attrs normalised by ``_validate``), runs the
op-specific checks and returns the output array or the tuple of outputs in TF's order.
It runs the compiled kernels through ``tfgrad.dispatch.<family>`` unless the reference is
selected (``tfgrad.use_impl("reference")``); it imports no kernel itself (but for
depthwise convolution, whose module calls its kernels directly).
"""
