"""OpenAI's Responses API (``/v1/responses``): its body, its events, its stored responses and its routes."""
