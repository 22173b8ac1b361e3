"""One router module per resource; each parses, calls one service and renders."""
