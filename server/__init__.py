"""The Starlette/uvicorn HTTP server, its OpenAI-compatible routes and batch jobs, and the `cobatch` CLI."""
