"""The contracts every layer above builds on: settings models (what YAML and run config can say), hardware and
speed, the job a worker receives, the result it sends back, and the asset checks a kind declares."""
