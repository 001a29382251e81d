"""TF 2.21's semantics in torch tensor ops, for every device (CUDA first): one module per
op family, one function per op named as the TF op (see each module's BOUNDS for how far
it is from TF's CPU kernels)."""
