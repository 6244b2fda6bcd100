"""What a pipeline is: its YAML's shape, one typed model per stage kind, and the kind registry."""
