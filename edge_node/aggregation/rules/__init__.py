"""The aggregation's rules, one pure core each: zone intrusion, line crossing, dwell,
counts per interval, cross-camera correlation. Each takes sightings in event-time order
(``observe``) and the event time reached (``advance``), and returns events; each holds
bounded, evicted state. Built from the rules file by ``edge_node.aggregation.config``.
"""
