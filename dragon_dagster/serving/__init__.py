"""`dragon serve`: the OpenAI-compatible front every client talks to. The protocol, the models by registry name
and their hot swap, keys and limits, traces and feedback are here; the decoding is an engine behind it
(engine/serve/)."""
