"""Node identity: the fleet CA that certifies nodes, and bootstrap tokens and labels.

Pure rules and key files only; enrollment bookkeeping lives in `control_plane.nodes`.
"""
