"""Batched serving after Seer's cut: bucket tables (``buckets``), the Padding-Waste-Ratio router
(``router``: which path a batch runs), CUDA graphs per bucket (``graph_cache``), and the policy
that runs each step on the chosen path (``execution.RoutedExecution``)."""
