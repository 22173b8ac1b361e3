"""The model bundle: how a signed model version is run, shared by both sides (ADR 0026).

A model target's signed ``custom.runtime`` says how frames become the model's input and how
its outputs become structured results. ``spec`` is that contract (pure: parse, check against
the model's I/O signature, the signed form); ``preprocess`` (numpy) turns a frame into the
input tensor, recording where the frame went (``geometry``), and ``decoders`` (numpy) turn
outputs into ``results`` — one implementation, which the CLI uses to make the self-test
reference and the node uses for every frame. The server reads only ``spec`` and ``results``.
Importing this package imports nothing else.
"""
