"""The REST API (FastAPI): `app` builds it; no business logic lives here."""
