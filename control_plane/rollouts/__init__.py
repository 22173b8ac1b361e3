"""Rollouts: a model version moved to a fleet's nodes in stages, judged by the canary gates,
and rolled back when it is worse. The pure cores (spec, plan, machine, gates) live here;
nothing is imported by this package itself: import the modules directly."""
