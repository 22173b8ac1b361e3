"""What the model saw, as an operator gets to see it: a bounded sample of the node's results.

``sampling`` (pure) decides which ``protos.bundle.results.InferenceResult`` are kept: the
agent offers every one from the pipeline's threads, the sampler keeps at most one per
stream and interval (preferring one with detections) under a node-wide rate. ``feed`` moves
the sample into the outbox as ``edgefleet.agent.results/1`` records of kind ``results``,
which are best effort: the outbox drops them first. Importing this package starts nothing.
"""
