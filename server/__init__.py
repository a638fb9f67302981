"""The Starlette/uvicorn HTTP server, its OpenAI-compatible routes, Anthropic's Messages API and batch jobs, and the `cobatch` CLI."""
