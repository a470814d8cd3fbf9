"""Constrained decoding: grammars for JSON schemas and tool calls, and the matchers that mask the logits.

`constraint` builds a request's grammar (what the engine is asked to produce); `matchers` holds one
llguidance matcher per constrained sequence and turns the matchers' states into masked logits rows,
speculation included; `bitmask` applies a packed token bitmask to a batch of logits.
"""
