"""ejk: a kernel framework for JAX."""
