"""Node inventory and enrollment over the relational store (see `service.NodeService`)."""
