"""Chat feedback's store: what its users call (store.py, the protocol), the records and the refusals every backend
shares (records.py), the SQL both backends run (sql.py), the two backends (sqlite.py, postgres.py: neither imports
the other) and the one function that opens the store a setting names (opener.py).

Framework-free: nothing here imports Dagster."""
