"""Text: plain string functions every layer above may use (matching replies against references)."""
