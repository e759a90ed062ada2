"""The OpenAI-compatible proxy: routes each request to the engine pool the cost model picks."""
