"""The edge node agent (box side). Its subpackages are imported directly; nothing here."""
