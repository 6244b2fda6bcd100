"""The framework-free core of dragon-dagster: nothing here imports Dagster; the Dagster layer (assets/,
resources/) calls into it, and so can a notebook or a plain script.

Its packages form a stack, each importing only those below it (pyproject.toml's import-linter contract checks
this in `make test`):

    runtime | runs | serve
                       the worker process and its launch targets; reading the runs back; decoding for
                       `dragon serve` (continuous batching, or an upstream server on the GGUF export)
    pipeline           the YAML: stages wired in order, profiles, retraining from feedback, preflight
    catalog            every stage kind by name (one line each), and `register` for kinds from outside
    stages             one folder per stage kind
    train | release    what every trainer shares; merging, model cards, GGUF export, the model registry
    evaluate           metrics, replies, judge, plots
    rewards            verifiable rewards, one module per family
    infer              generation, log-probabilities, backends, chat
    models             presets, the embedded model, loading
    tools              a pipeline's tools: declared, rendered, run with a time limit, calls parsed and scored
    data               tables, dataset stages' base and checks, the feedback store and its rows
    artifacts          artifact directories, typed manifests, checkpoints, progress rows
    config             settings, hardware and speed, the job and result contracts, checks, the kind entry
    outages            a store that is down or refuses the login, as one line: store, setting, host, fix
    text | commands | source_files
                       string functions (matching replies) | an argv, no shell | a user's Python file, run
"""
