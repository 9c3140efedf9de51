"""The step-time model and its evidence."""
