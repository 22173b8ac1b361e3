"""The node's side of the link to the control plane: one port, two transports."""
