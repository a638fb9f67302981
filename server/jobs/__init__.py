"""Batch jobs: OpenAI's Files and Batch APIs on a durable store, and the offline runner."""
