"""Canary rollouts. Import the modules directly (``gates`` is a pure core)."""
