"""Rows to train on: tables read and mapped through column templates, held-out splits, synthesized data."""
