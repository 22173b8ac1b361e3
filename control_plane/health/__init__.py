"""Fleet health: node health reports as time series (raw, per minute, per hour) and alerts.

Pure cores: ``report`` (reading a report), ``rollup`` (roll-up math), ``alerts`` (rules and
life cycle), ``config``. Adapters (SQLAlchemy): ``processor``, ``queries``, ``retention``,
``clearing``, sharing ``rows``. Import the modules directly.
"""
