"""The updater (DESIGN §5): director checks, the model store, the update journal and the
reconciler that takes a signed assignment to the running model.

`director` verifies signed assignments (pure); `journal` holds the active / previous /
trial state and its transitions; `store` keeps model files by content hash; `tuf_fetch`
runs `tuf.ngclient` over the node's link; `download` fetches a target resumably;
`selftest` checks a model against its reference pair; `reconciler` ties them together.
The hot swap itself is the agent's, behind the `host.ModelHost` port; when to apply is
the agent's update task (`edge_node.agent.update_task`).
"""
