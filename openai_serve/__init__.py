"""openai-serve: an OpenAI-compatible streaming server over the engine in `core`."""
