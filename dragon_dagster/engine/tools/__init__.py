"""Tools a pipeline declares: their JSON schemas, how a chat template renders them, calls parsed from replies."""
