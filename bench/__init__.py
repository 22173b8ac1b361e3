"""Benchmarks (not tests): each module's ``main()`` prints a figure beside its same-run baseline.

Run one with ``python -m bench.<name>``, all with ``python -m bench.run_all`` (``make bench``);
docs/benchmarks.md says what each measures and what the last run gave.
"""
