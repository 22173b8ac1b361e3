"""The operator CLI (`edgefleet`): `launch` is the console script, `main` the typer app."""
