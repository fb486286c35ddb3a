"""Batched serving after Seer's cut: bucket tables (``buckets``), the Padding-Waste-Ratio router
(``router``: which path a group of rows runs), and the routed layouts (``routed``: how the model
runner lays a step out on the chosen path, a static bucket's inputs in persistent buffers)."""
