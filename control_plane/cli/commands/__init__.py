"""The CLI's command groups, one module each; they talk to the server over HTTP only."""
