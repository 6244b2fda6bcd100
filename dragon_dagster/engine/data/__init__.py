"""Rows to train on: tables read and mapped through column templates and split (tables.py), what every dataset
stage shares and its checks (stage.py, checks.py), and chat feedback's store and the rows it becomes."""
