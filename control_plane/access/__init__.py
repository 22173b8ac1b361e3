"""API tokens, roles and the audit log: `roles` (pure) and `service` (storage)."""
