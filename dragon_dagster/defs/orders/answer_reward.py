"""The orders pipeline's answer reward: does the final answer state the status the order system returned?

The reference is the answer a good agent gives (example_data/make_order_data.py); what matters in it is the
order's status. 1.0 when the answer names the reference's status and no other, 0.0 otherwise.
"""

STATUSES = ("processing", "shipped", "out for delivery", "delivered")


def named(text: str) -> set[str]:
    text = text.lower().replace("being processed", "processing")
    return {s for s in STATUSES if s in text}


def reward(prompt, completion, reference, row):
    expected = named(str(reference))
    return 1.0 if expected and named(completion) == expected else 0.0
