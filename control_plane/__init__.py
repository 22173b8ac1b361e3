"""The control plane (cloud side). Its subpackages are imported directly; nothing here."""
