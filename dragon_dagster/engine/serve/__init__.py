"""Decoding for `dragon serve`: the engines behind the server's one front (the built-in continuous batcher on a
model directory, or an OpenAI-compatible upstream), with the request and reply types they share. The protocol,
keys, limits, traces and feedback live in the front (dragon_dagster/serving/)."""
