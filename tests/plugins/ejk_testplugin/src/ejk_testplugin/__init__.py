"""A third-party ejk plugin for tests (see the README)."""
