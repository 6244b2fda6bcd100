"""Talking to models: local and server backends, and the chat session whose ratings become feedback."""
