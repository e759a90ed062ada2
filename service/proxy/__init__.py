"""The OpenAI-compatible proxy: each request to the engine pool the cost model picks.

entrance.py (the front door) -> decision.py (the routing decision) -> relay/ (attempts, whole
answer, stream) over engine_advisor.service.transport."""
