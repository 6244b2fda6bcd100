"""Rows to train on: tables read (tables.py), mapped through column templates into chat rows (row_mapping.py,
read back by row_parts.py) and held out (holdout.py), what every dataset stage shares and its checks (stage.py,
checks.py), and chat feedback's store and the rows it becomes."""
