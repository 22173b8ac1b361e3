"""Example programs for firmware developers (run them; they are tested)."""
