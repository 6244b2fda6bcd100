"""Tools a pipeline declares: their JSON schemas, how a chat template renders them, calls parsed from replies.

Modules, each with one job:
- template: the chat template that renders tools and tool turns (the model's own, else the fallback format).
- declare: the `Tools` settings (a Python file, YAML schemas) and the `Toolset` that runs calls with a time limit.
- calls: tool calls parsed out of a reply, and validated against the declared schemas.
- metrics: per-reply scores (a valid call, the right tool, the right arguments) and the reference call.
"""
