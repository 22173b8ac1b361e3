"""Aggregation on the edge node: many cameras' detections in, events an operator cares
about out (zone intrusion, line crossing, dwell, counts, cross-camera transit).

Pure cores all of it, except ``rules_file`` (reads the YAML file): ``model`` (the domain
types and the seam the device and runtime adapters target), ``timeline`` (event time,
watermarks, lateness, duplicates), ``tracker``, ``rules/`` (one core per rule),
``config`` (the rules document, checked), ``engine`` (the pipeline), ``wire`` (events.proto).
Importing this package starts nothing and imports none of its modules.
"""
