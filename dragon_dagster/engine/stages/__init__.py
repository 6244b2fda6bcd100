"""The stage kinds, one folder each (settings, worker, result, checks, report figures); catalog.py lists them."""
