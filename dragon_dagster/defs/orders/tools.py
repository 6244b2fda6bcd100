"""The orders pipeline's tool: look up an order in the shop's (synthetic) order system.

Declared in defs.yaml as `tools: {file: tools.py}`. Each public function here is a tool: its type hints and its
docstring's Args become the JSON schema the model sees (transformers' get_json_schema). The order system is a
pure function of the order number, so the training data (example_data/make_order_data.py), the GRPO rollouts
and the chat page all see the same orders.
"""

from __future__ import annotations

import json
import re
import zlib

STATUSES = ("processing", "shipped", "out for delivery", "delivered")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
ORDER_ID = re.compile(r"^[A-Z]\d{4}$")


def order_status(order_id: str) -> str:
    """Look up the status of a customer's order.

    Args:
        order_id: The order number, one capital letter and four digits, like "A1042".
    """
    order_id = order_id.strip().upper()
    if not ORDER_ID.match(order_id):
        raise ValueError(f"no order {order_id!r}: an order number is a letter and four digits, like A1042")
    code = zlib.crc32(order_id.encode())
    status = STATUSES[code % len(STATUSES)]
    record = {"order_id": order_id, "status": status}
    if status != "delivered":
        record["arrives"] = DAYS[(code // 7) % len(DAYS)]
    return json.dumps(record)
