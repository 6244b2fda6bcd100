"""Measuring models: replies and their metrics on held-out rows, the pairwise judge, a retraining's gain on held-out
feedback, and the loss plots. The report itself is the evaluate stage kind (stages/evaluate/)."""
