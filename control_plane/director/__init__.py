"""The director (DESIGN §3): signed per-node assignments "node N shall run target T".

`assignments` signs (pure, plus the director key file); `service` decides and stores.
The node-side verification lives in `edge_node.updater.director`, never imported here.
"""
