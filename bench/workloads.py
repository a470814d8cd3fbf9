"""Prompts for the engine benchmark: an open question, a code edit, and a RAG answer.

They differ in how much of the answer already sits in the prompt, which is what
decides whether prompt-lookup speculation pays: nothing for the open question,
most of it for the code edit, quoted sentences for the RAG answer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Workload:
    name: str
    messages: list[dict[str, str]]

    def text(self, tokenizer: Any) -> str:
        """The prompt through the model's chat template, ready for the assistant's answer; for a base model without
        one (Gemma 3 270M), the messages' contents as one plain document, each after a blank line."""
        if tokenizer.chat_template:
            return tokenizer.apply_chat_template(self.messages, add_generation_prompt=True, tokenize=False)
        return "".join(m["content"] + "\n\n" for m in self.messages)

    def token_ids(self, tokenizer: Any) -> list[int]:
        """text() as the model's tokens (the template's own special tokens, or the tokenizer's BOS for a document)."""
        if tokenizer.chat_template:
            enc = tokenizer.apply_chat_template(self.messages, add_generation_prompt=True, tokenize=True)
            return list(enc["input_ids"] if hasattr(enc, "keys") else enc)  # a BatchEncoding in newer transformers
        return list(tokenizer(self.text(tokenizer))["input_ids"])


OPEN_QUESTION = Workload(
    name="open_question",
    messages=[{"role": "user", "content": "Why do people enjoy long walks in the countryside? Give a few reasons."}],
)

CODE_FUNCTION = '''def summarize_orders(orders, currency="EUR", include_refunds=False):
    """Aggregate a list of order dicts into totals per customer."""
    totals = {}
    counts = {}
    largest = {}
    for order in orders:
        customer = order["customer"]
        amount = order["amount"]
        if order.get("currency", currency) != currency:
            amount = convert(amount, order["currency"], currency)
        if order.get("refunded") and not include_refunds:
            continue
        if customer not in totals:
            totals[customer] = 0.0
            counts[customer] = 0
            largest[customer] = 0.0
        totals[customer] += amount
        counts[customer] += 1
        if amount > largest[customer]:
            largest[customer] = amount
    report = []
    for customer, total in totals.items():
        average = total / counts[customer]
        report.append(
            {
                "customer": customer,
                "total": round(total, 2),
                "orders": counts[customer],
                "average": round(average, 2),
                "largest": round(largest[customer], 2),
                "currency": currency,
            }
        )
    report.sort(key=lambda row: row["total"], reverse=True)
    return report


def convert(amount, source, target):
    rates = {"EUR": 1.0, "USD": 0.92, "GBP": 1.17}
    return amount * rates[source] / rates[target]
'''

CODE_EDIT = Workload(
    name="code_edit",
    messages=[
        {
            "role": "user",
            "content": "Rename the variable `totals` to `spent` in this Python code and print the whole updated "
            "code, nothing else.\n\n```python\n" + CODE_FUNCTION + "```",
        }
    ],
)

RAG_CONTEXT = """The harbour town of Lindvik grew around a deep, sheltered inlet on the northern coast. In the twelfth century fishermen from the surrounding islands began to winter there, because the inlet rarely froze and the cliffs kept off the worst of the storms. By the fourteenth century the settlement had a stone church, a market square and a wooden quay that could berth twenty boats at once.

Trade changed the town in the sixteenth century. Merchants from the south arrived to buy dried cod, which kept for years and could be shipped across the sea without spoiling. The merchants built warehouses along the quay and paid for a new harbour wall made of granite blocks cut from the hills behind the town. The wall still stands today and is the oldest surviving structure in Lindvik.

The town's prosperity depended on the fish, and the fish were not always there. Records kept by the church show that in the years 1623, 1641 and 1688 the cod did not come to the inlet at all, and many families left for the inland farms. After the failure of 1688 the town council decided that no family could depend on fishing alone, and every household was given a strip of land on the hillside to grow barley and potatoes.

In the nineteenth century a railway line reached Lindvik from the capital. The first train arrived on the ninth of May 1874, carrying a brass band and the minister of transport, who gave a speech on the quay about the future of the northern coast. The railway made it possible to sell fresh fish rather than dried fish, and within twenty years three canning factories had opened beside the station.

The factories brought workers from all over the country, and the population of Lindvik rose from eleven hundred in 1870 to almost four thousand in 1900. New streets were laid out on the flat ground east of the harbour, and the town built its first school, its first hospital and a public bath house heated by steam from the largest factory.

The twentieth century was harder. Two of the canneries closed during the depression of the nineteen thirties, and the third burned down in 1951 and was never rebuilt. Many young people moved to the cities. The railway station closed to passengers in 1968, although freight trains continued to use the line until 1992.

Today Lindvik is known for its museum of fishing, which occupies the old merchants' warehouses on the quay, and for the summer festival held every year in the second week of July. The festival begins with a procession of boats around the harbour wall and ends with a concert in the market square. About two thousand people live in the town all year round, and the population doubles during the summer months."""

RAG_ANSWER = Workload(
    name="rag",
    messages=[
        {
            "role": "user",
            # Context first, then the ask: the small default model quotes far more faithfully this way.
            "content": "Context:\n" + RAG_CONTEXT + "\n\nCopy word for word the paragraph of the context that "
            "describes the arrival of the railway.",
        }
    ],
)

ALL = (OPEN_QUESTION, CODE_EDIT, RAG_ANSWER)
BY_NAME = {w.name: w for w in ALL}
