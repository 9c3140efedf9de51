"""mgpu_lib."""
