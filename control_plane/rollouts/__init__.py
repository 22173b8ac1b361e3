"""Rollouts: a model version moved to a fleet's nodes in stages, judged, and rolled back
when it is worse. The pure cores (spec, plan, machine) live here; nothing is imported
by this package itself."""
