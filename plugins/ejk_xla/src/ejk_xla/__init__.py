"""ejk-xla: XLA kernels for every ejk operation."""
