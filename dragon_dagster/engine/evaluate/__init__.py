"""Measuring models: replies and their metrics, the pairwise judge, the base-against-merged report."""
