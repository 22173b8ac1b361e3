"""Fleet health: node health reports as time series (raw, per minute, per hour) and alerts.

Pure cores: ``report`` (reading a report), ``rollup`` (roll-up math), ``alerts`` (rules and
life cycle), ``config``. Adapter: ``store`` (SQLAlchemy). Import the modules directly.
"""
