"""Running models: generation and reply log-probabilities (generation.py, logprobs.py, decode_weights.py), local
and server backends, and the chat session whose ratings become feedback."""
