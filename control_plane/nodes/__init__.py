"""Node inventory and enrollment over the relational store, one service per role (`wiring`)."""
