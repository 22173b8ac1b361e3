"""The event store: nodes' aggregation events (``edgefleet.event/1``), kept per fleet.

Pure cores: ``wire`` (reading an event record's payload), ``query`` (filters, keyset
cursors, retention policy). Adapter (SQLAlchemy): ``store`` (reads, retention, and the
insert the record ingest calls in its group commit). Import the modules directly.
"""
