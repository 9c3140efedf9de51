"""Experiments the pages run."""
